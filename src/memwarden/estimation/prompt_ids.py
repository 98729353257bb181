"""The prompt's token ids as the family's processor writes them: which ids are special, the
begin/end markers around each medium, the placeholder a medium's tokens carry, the prompt an image
encoder reads in its own vocabulary (InstructBLIP's Q-Former), and the context the text model takes.
Read from the config (and, for what the model's forward takes, its signature); nothing is run."""

from __future__ import annotations

import inspect
from typing import Any

from memwarden.errors import InputError

__all__ = [
    "FIRST_TEXT_ID",
    "context_of",
    "encoder_prompt",
    "image_token_id",
    "media_markers",
    "placeholder_id",
    "special_ids",
    "takes_position_mask",
]

FIRST_TEXT_ID = 3  # 0 pad, 1 BOS, 2 EOS in most vocabularies


def special_ids(config: Any) -> list[int]:
    ids: list[int] = []
    for cfg in (config, config.get_text_config()):
        for key, value in vars(cfg).items():
            if key.endswith(("token_id", "token_index")) and isinstance(value, int) and not isinstance(value, bool):
                ids.append(value)
    return ids


def media_markers(config: Any, kind: str = "image") -> tuple[list[int], list[int]]:
    """The begin/end ids the processor wraps each image, video or audio in (Qwen-VL, GLM-4V); none elsewhere."""
    prefixes = {"image": ("vision", "image"), "video": ("vision", "video"), "audio": ("audio",)}[kind]
    for prefix in prefixes:
        start, end = getattr(config, f"{prefix}_start_token_id", None), getattr(config, f"{prefix}_end_token_id", None)
        if isinstance(start, int) and isinstance(end, int) and not isinstance(start, bool):
            return [start], [end]
    return [], []


def image_token_id(config: Any, kind: str = "image") -> int:
    for key in (f"{kind}_token_id", f"{kind}_token_index"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise InputError(f"model_type {config.model_type!r} names no {kind} token; send a text-only request")


def encoder_prompt(model: Any, config: Any, n_text: int, batch: int) -> dict[str, Any]:
    """The prompt as an image encoder that reads it gets it, in its own vocabulary: InstructBLIP's
    Q-Former takes ``qformer_input_ids`` (the processor tokenizes the prompt a second time, with the
    Q-Former's BERT tokenizer: [CLS] text [SEP]). Found by the encoder's parameters: ``NAME_input_ids``
    where the config has a ``NAME_config``. Empty for every other model.

    The ids are ordinary ones of that vocabulary; the prompt is cut to the encoder's positions
    (``max_position_embeddings``, 512 for BERT), as a longer one does not run."""
    import torch

    encode = getattr(model, "get_image_features", None) or getattr(
        getattr(model, "model", None), "get_image_features", None
    )
    if encode is None:
        return {}
    out: dict[str, Any] = {}
    for name in inspect.signature(encode).parameters:
        prefix = name.removesuffix("_input_ids")
        sub = getattr(config, f"{prefix}_config", None) if name.endswith("_input_ids") else None
        vocab = getattr(sub, "vocab_size", None)
        if not isinstance(vocab, int) or vocab <= FIRST_TEXT_ID:
            continue
        length = n_text + 2  # [CLS] ... [SEP]
        positions = getattr(sub, "max_position_embeddings", None)
        if isinstance(positions, int) and positions > 0:
            length = min(length, positions)
        row = torch.arange(length, dtype=torch.long) % (vocab - FIRST_TEXT_ID) + FIRST_TEXT_ID
        out[name] = row.repeat(batch, 1)
        out[f"{prefix}_attention_mask"] = torch.ones((batch, length), dtype=torch.long)
    return out


def placeholder_id(model: Any, config: Any, kind: str) -> int:
    """The id a medium's placeholders carry: the config's token id, or, for a model that finds the
    image by a position mask (Kosmos-2's ``image_embeds_position_mask``: its processor puts ids after
    ``<unk>`` there, ordinary text embeddings), an ordinary text id."""
    if kind == "image" and takes_position_mask(model):
        try:
            return image_token_id(config, kind)
        except InputError:
            return FIRST_TEXT_ID
    return image_token_id(config, kind)


def takes_position_mask(model: Any) -> bool:
    return "image_embeds_position_mask" in inspect.signature(model.forward).parameters


def context_of(config: Any) -> int | None:
    """Tokens the text model takes: its ``max_position_embeddings``, an encoder-decoder's decoder
    ``max_target_positions`` (Whisper's 448)."""
    text = config.get_text_config()
    for value in (getattr(text, "max_position_embeddings", None), getattr(config, "max_target_positions", None)):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
