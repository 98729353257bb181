"""Requests for zoo models without processors: ``make_inputs``, ``placeholder_tokens``, ``generate_kwargs``.

The tensors are those a family's processor would return; how each family lays them out is on
its ``Arch`` (``memwarden.models.zoo.archs``).
"""

from __future__ import annotations

from typing import Any

import torch

from memwarden.errors import InputError
from memwarden.models.zoo.archs import ARCH_BY_FAMILY, build_config, family_arch
from memwarden.models.zoo.base import FIRST_TEXT_ID, MEL_FRAMES_PER_SECOND, PAD_ID, Arch, Request


def _resolve(model_or_name: Any, size: str) -> tuple[Arch, Any]:
    """(family, config) of a zoo name, a zoo model or its config."""
    if isinstance(model_or_name, str):
        return family_arch(model_or_name), build_config(model_or_name, size)
    cfg = getattr(model_or_name, "config", model_or_name)
    family = getattr(cfg, "model_type", None)
    if family not in ARCH_BY_FAMILY:
        raise InputError(f"not a zoo model family: {family!r}; zoo families: {', '.join(sorted(ARCH_BY_FAMILY))}")
    return ARCH_BY_FAMILY[family], cfg


def _request(
    arch: Arch, cfg: Any, image_size: tuple[int, int] | None, audio_seconds: float | None, batch: int
) -> Request:
    if batch < 1:
        raise InputError(f"batch must be at least 1; got {batch}")
    if arch.modality == "vision":
        if audio_seconds is not None:
            raise InputError(f"{arch.name} is a vision model; it takes image_size, not audio_seconds")
        wh = tuple(image_size) if image_size is not None else arch.native_image_size(cfg)
        if wh is None or len(wh) != 2:
            raise InputError(f"image_size must be (width, height) in px; got {image_size!r}")
        image_wh = (int(wh[0]), int(wh[1]))
        arch.check_image(cfg, image_wh)
        return Request(batch=batch, image_wh=image_wh, audio_frames=None)
    if image_size is not None:
        raise InputError(f"{arch.name} is an audio model; it takes audio_seconds, not image_size")
    shortest, default, longest = arch.audio_frames_range(cfg)
    frames = default if audio_seconds is None else round(audio_seconds * MEL_FRAMES_PER_SECOND)
    if not shortest <= frames <= longest:
        raise InputError(
            f"{arch.name} takes {shortest / MEL_FRAMES_PER_SECOND:g} to {longest / MEL_FRAMES_PER_SECOND:g} s of "
            f"audio (its encoder window is {longest} mel frames at {MEL_FRAMES_PER_SECOND}/s); got {audio_seconds} s"
        )
    return Request(batch=batch, image_wh=None, audio_frames=frames)


def placeholder_tokens(
    name: str,
    *,
    image_size: tuple[int, int] | None = None,
    audio_seconds: float | None = None,
    size: str = "tiny",
) -> int:
    """How many image/audio placeholder tokens one request puts in each row of ``input_ids``.

    ``name`` may also be a zoo model or its config (then ``size`` is ignored).
    """
    arch, cfg = _resolve(name, size)
    return arch.placeholders(cfg, _request(arch, cfg, image_size, audio_seconds, batch=1))


def make_inputs(
    model_or_name: Any,
    *,
    image_size: tuple[int, int] | None = None,
    audio_seconds: float | None = None,
    prompt_tokens: int = 16,
    batch: int = 1,
    seed: int = 0,
    size: str = "tiny",
) -> dict[str, torch.Tensor]:
    """Everything ``model.generate(**inputs, ...)`` needs, one image (or audio clip) per row.

    ``model_or_name`` is a zoo model, its config, or a zoo name (then ``size`` picks the config).
    ``prompt_tokens`` counts every text token, markers and BOS included; the placeholders come on
    top: ``input_ids.shape[1] == prompt_tokens + placeholder_tokens(...)``. Rows share the layout
    and differ in text and media. Pixel and audio tensors are float32, as processors return them;
    the models cast them to their own dtype. Deterministic for a seed.
    """
    arch, cfg = _resolve(model_or_name, size)
    req = _request(arch, cfg, image_size, audio_seconds, batch)
    lead, opening, closing = arch.markers(cfg)
    n_markers = len(lead) + len(opening) + len(closing)
    if prompt_tokens < n_markers:
        raise InputError(
            f"{arch.name} needs prompt_tokens >= {n_markers} (its BOS/begin/end-of-media markers); got {prompt_tokens}"
        )
    media = opening + [arch.placeholder_id(cfg)] * arch.placeholders(cfg, req) + closing
    first_special = cfg.get_text_config().vocab_size - arch.n_special

    gen = torch.Generator().manual_seed(seed)
    n_text = prompt_tokens - n_markers
    text = torch.randint(FIRST_TEXT_ID, first_special, (batch, n_text), generator=gen).tolist()  # (B, n_text)
    n_before = n_text // 4  # a short instruction lead-in, then the media, then the question
    if arch.media_first:
        rows = [media + lead + words for words in text]
    else:
        rows = [lead + words[:n_before] + media + words[n_before:] for words in text]

    input_ids = torch.tensor(rows, dtype=torch.long)  # (B, T)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    inputs.update(arch.extra_text_tensors(cfg, input_ids))
    inputs.update(arch.media(cfg, req, gen))
    return inputs


def generate_kwargs(name: str) -> dict[str, Any]:
    """``model.generate`` kwargs for greedy decoding that runs exactly ``max_new_tokens`` steps.

    ``eos_token_id=None`` overrides the generation config's EOS, so the length criterion is the
    only stopping criterion; the pad id is set so that transformers does not pick one.
    """
    family_arch(name)
    return {"do_sample": False, "num_beams": 1, "eos_token_id": None, "pad_token_id": PAD_ID}
