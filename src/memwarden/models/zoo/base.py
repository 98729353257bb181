"""Zoo conventions and the family base class: token ids, shared shapes, ``ZooSpec``, ``Arch``.

The families themselves live in ``memwarden.models.zoo.archs``; the module docstring of
``memwarden.models.zoo`` describes the conventions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from memwarden.errors import InputError

SIZES = ("tiny", "small")
ATTN_IMPLEMENTATION = "sdpa"

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_TEXT_ID = 3
MEL_FRAMES_PER_SECOND = 100  # Whisper-style feature extractor: hop 160 samples at 16 kHz


@dataclass(frozen=True, kw_only=True)
class ZooSpec:
    """What a zoo model is and which requests it takes, for one size."""

    name: str
    family: str  # transformers model_type
    modality: Literal["vision", "audio"]
    size: str
    model_class: str  # transformers class the model is an instance of
    native_image_size: tuple[int, int] | None  # (W, H) px; None for audio models
    dynamic_resolution: bool  # accepts any (W, H) that is a multiple of image_multiple_px
    image_multiple_px: int | None  # Qwen-VL: patch_size * spatial_merge_size
    default_audio_seconds: float | None
    max_audio_seconds: float | None  # the encoder's fixed input window
    placeholder_token_id: int  # the image/audio token repeated once per placeholder
    marker_token_ids: tuple[int, ...]  # BOS and begin/end-of-media tokens a request carries
    description: str


# ---------------------------------------------------------------------------------------------
# Shapes shared by every family, so that families differ only where their architectures do.
# small: a 384-wide 6-layer encoder (ViT-S-like) and a 512-wide 6-layer language model with GQA
# (8 query, 4 KV heads) and a 16k vocabulary: 38-53M parameters in all.

TEXT_SIZES = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 1024},
    "small": {"hidden": 512, "layers": 6, "heads": 8, "kv_heads": 4, "ffn": 1536, "vocab": 16384},
}
ENCODER_SIZES = {
    "tiny": {"hidden": 32, "layers": 2, "heads": 2, "ffn": 64},
    "small": {"hidden": 384, "layers": 6, "heads": 6, "ffn": 1536},
}
_MAX_POSITIONS = 4096


def text_config(size: str, **extra: Any) -> dict[str, Any]:
    """A decoder-only text config dict (Llama / Gemma / Qwen2 keys)."""
    t = TEXT_SIZES[size]
    return {
        "vocab_size": t["vocab"],
        "hidden_size": t["hidden"],
        "intermediate_size": t["ffn"],
        "num_hidden_layers": t["layers"],
        "num_attention_heads": t["heads"],
        "num_key_value_heads": t["kv_heads"],
        "max_position_embeddings": _MAX_POSITIONS,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        **extra,
    }


def vit_config(size: str, image_px: int, patch_px: int, **extra: Any) -> dict[str, Any]:
    """A CLIP / SigLIP / Idefics3 vision config dict."""
    e = ENCODER_SIZES[size]
    return {
        "image_size": image_px,
        "patch_size": patch_px,
        "hidden_size": e["hidden"],
        "num_hidden_layers": e["layers"],
        "num_attention_heads": e["heads"],
        "intermediate_size": e["ffn"],
        **extra,
    }


def top_ids(size: str, n: int) -> list[int]:
    """The ``n`` special ids at the top of the text vocabulary, lowest first."""
    vocab = TEXT_SIZES[size]["vocab"]
    return list(range(vocab - n, vocab))


@dataclass(frozen=True)
class Request:
    batch: int
    image_wh: tuple[int, int] | None  # (W, H) px
    audio_frames: int | None  # mel frames carrying audio (the rest of the window is padding)

    @property
    def image(self) -> tuple[int, int]:
        """(W, H) of a vision request (a vision family's code only runs for one)."""
        if self.image_wh is None:
            raise InputError("this request carries no image")
        return self.image_wh

    @property
    def frames(self) -> int:
        """Mel frames of an audio request."""
        if self.audio_frames is None:
            raise InputError("this request carries no audio")
        return self.audio_frames


def random_pixels(gen: torch.Generator, *shape: int) -> torch.Tensor:
    # Processor output is mean/std normalised: roughly zero-mean, unit-variance.
    return torch.randn(*shape, generator=gen)


# ---------------------------------------------------------------------------------------------
# One small class per family (the subclasses are in zoo_archs): config per size, placeholder count,
# markers, media tensors.


class Arch:
    name: str
    family: str
    model_class: str
    description: str
    modality: Literal["vision", "audio"] = "vision"
    n_special = 1  # special ids at the top of the vocabulary
    media_first = False  # PaliGemma: image tokens come before BOS and the prompt

    def config(self, size: str) -> Any:
        raise NotImplementedError

    def placeholders(self, cfg: Any, req: Request) -> int:
        raise NotImplementedError

    def placeholder_id(self, cfg: Any) -> int:
        return int(cfg.image_token_id)

    def markers(self, cfg: Any) -> tuple[list[int], list[int], list[int]]:
        """(lead, open, close): text-side tokens before the prompt text, right before and right after
        the placeholder run. All count towards ``prompt_tokens``."""
        return [BOS_ID], [], []

    def media(self, cfg: Any, req: Request, gen: torch.Generator) -> dict[str, torch.Tensor]:
        w, h = req.image
        return {"pixel_values": random_pixels(gen, req.batch, 3, h, w)}  # (B, 3, H, W)

    def extra_text_tensors(self, cfg: Any, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {}

    def finish_init(self, model: Any) -> None:
        """Fix up weights that transformers initialises in a way a random-weight model cannot use."""

    # vision requests
    def native_image_size(self, cfg: Any) -> tuple[int, int] | None:
        side = int(cfg.vision_config.image_size)
        return (side, side)

    def image_multiple(self, cfg: Any) -> int | None:
        return None  # fixed resolution

    def check_image(self, cfg: Any, image_wh: tuple[int, int]) -> None:
        native = self.native_image_size(cfg)
        if native is None:
            return
        if image_wh != native:
            raise InputError(
                f"{self.name} takes images of exactly {native[0]}x{native[1]} px (its vision tower has a "
                f"fixed resolution); got {image_wh[0]}x{image_wh[1]}. Resize the image to {native[0]}x{native[1]}."
            )

    # audio requests
    def audio_frames_range(self, cfg: Any) -> tuple[int, int, int]:
        """(shortest, default, longest) request in mel frames."""
        raise NotImplementedError

    def spec(self, size: str) -> ZooSpec:
        cfg = self.config(size)
        lead, opening, closing = self.markers(cfg)
        audio = self.modality == "audio"
        _, default_frames, max_frames = self.audio_frames_range(cfg) if audio else (0, 0, 0)
        return ZooSpec(
            name=self.name,
            family=self.family,
            modality=self.modality,
            size=size,
            model_class=self.model_class,
            native_image_size=None if audio else self.native_image_size(cfg),
            dynamic_resolution=self.image_multiple(cfg) is not None,
            image_multiple_px=self.image_multiple(cfg),
            default_audio_seconds=default_frames / MEL_FRAMES_PER_SECOND if audio else None,
            max_audio_seconds=max_frames / MEL_FRAMES_PER_SECOND if audio else None,
            placeholder_token_id=self.placeholder_id(cfg),
            marker_token_ids=tuple(lead + opening + closing),
            description=self.description,
        )
