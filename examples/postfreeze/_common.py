"""Shared helpers for the post-freeze evaluation corpus (files starting with ``_`` are not cases).

Everything here builds tiny models from plain transformers configs with random weights; nothing is
downloaded. The configs follow the recipe of ``memwarden.models.zoo`` (special tokens at the top of
the vocabulary, sdpa attention) so that ``zoo.make_inputs`` can write requests for them, but with
the widths, vocabularies and image sizes a case needs for its memory effect to be visible.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import transformers

from memwarden.models import zoo

PAD_ID, BOS_ID, EOS_ID = zoo.PAD_ID, zoo.BOS_ID, zoo.EOS_ID
MiB = 1024 * 1024


def text_config(
    hidden: int = 64,
    layers: int = 2,
    vocab: int = 1024,
    heads: int | None = None,
    kv_heads: int | None = None,
    ffn: int | None = None,
    **extra,
) -> dict:
    """A Llama/Qwen2-style decoder config dict with 16-wide heads."""
    heads = heads or max(hidden // 16, 1)
    kv_heads = kv_heads or max(heads // 2, 1)
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": ffn or 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "max_position_embeddings": 16384,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        **extra,
    }


def llava(
    image_px: int = 32,
    patch_px: int = 8,
    vision_hidden: int = 32,
    vision_layers: int = 2,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    **text,
) -> torch.nn.Module:
    """A LLaVA-1.5-style model (CLIP ViT + MLP projector + Llama) with random weights, eval mode."""
    t = text_config(**text)
    cfg = transformers.LlavaConfig(
        vision_config={
            "model_type": "clip_vision_model",
            "image_size": image_px,
            "patch_size": patch_px,
            "hidden_size": vision_hidden,
            "num_hidden_layers": vision_layers,
            "num_attention_heads": 2,
            "intermediate_size": 2 * vision_hidden,
        },
        text_config={"model_type": "llama", **t},
        image_token_index=t["vocab_size"] - 1,
        image_seq_length=(image_px // patch_px) ** 2,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        pad_token_id=PAD_ID,
    )
    return zoo.build_from_config("llava", cfg, dtype=dtype, seed=seed)


def qwen2_vl(
    native_px: int = 112, vision_hidden: int = 32, vision_layers: int = 2, seed: int = 0, **text
) -> torch.nn.Module:
    """A Qwen2-VL-style model (dynamic-resolution ViT + 2x2 merger + Qwen2 with M-RoPE)."""
    t = text_config(**text)
    half = t["head_dim"] // 2
    spatial = (half - half // 4) // 2
    t["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 1_000_000.0,
        "mrope_section": [half - 2 * spatial, spatial, spatial],
    }
    vocab = t["vocab_size"]
    cfg = transformers.Qwen2VLConfig(
        vision_config={
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "depth": vision_layers,
            "embed_dim": vision_hidden,
            "num_heads": 2,
            "mlp_ratio": 2,
            "hidden_size": t["hidden_size"],
        },
        text_config=t,
        vision_start_token_id=vocab - 4,
        vision_end_token_id=vocab - 3,
        image_token_id=vocab - 2,
        video_token_id=vocab - 1,
    )
    cfg.native_image_px = native_px
    return zoo.build_from_config("qwen2-vl", cfg, seed=seed)


def qwen2_audio(
    window_s: float = 2.0, audio_hidden: int = 32, audio_layers: int = 2, seed: int = 0, **text
) -> torch.nn.Module:
    """A Qwen2-Audio-style model (Whisper-like encoder over a fixed mel window + projector + Qwen2)."""
    t = text_config(**text)
    cfg = transformers.Qwen2AudioConfig(
        audio_config={
            "model_type": "qwen2_audio_encoder",
            "d_model": audio_hidden,
            "encoder_layers": audio_layers,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 2 * audio_hidden,
            "num_mel_bins": 128,
            "max_source_positions": int(window_s * zoo.MEL_FRAMES_PER_SECOND / 2),
        },
        text_config={"model_type": "qwen2", **t},
        audio_token_index=t["vocab_size"] - 1,
    )
    return zoo.build_from_config("qwen2-audio", cfg, seed=seed)


def idefics3(
    image_px: int = 64, patch_px: int = 4, scale: int = 2, vision_hidden: int = 32, seed: int = 0, **text
) -> torch.nn.Module:
    """A SmolVLM / Idefics3-style model (SigLIP-like ViT + pixel shuffle + Llama)."""
    t = text_config(**text)
    cfg = transformers.Idefics3Config(
        vision_config={
            "image_size": image_px,
            "patch_size": patch_px,
            "hidden_size": vision_hidden,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 2 * vision_hidden,
        },
        text_config={"model_type": "llama", **t},
        image_token_id=t["vocab_size"] - 1,
        scale_factor=scale,
        pad_token_id=PAD_ID,
    )
    return zoo.build_from_config("idefics3", cfg, seed=seed)


def text_ids(n: int, vocab_top: int, seed: int = 0) -> torch.Tensor:
    """(1, n) ordinary text token ids (below the special ids at the top of the vocabulary)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(zoo.FIRST_TEXT_ID, vocab_top, (1, n), generator=g)


def fake_rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A decoded RGB image / video frame as a camera or decoder returns it: (H, W, 3) uint8."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def normalize(frames: np.ndarray) -> torch.Tensor:
    """uint8 (..., H, W, 3) -> float32 (..., 3, H, W), mean/std normalised like a processor does."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).float().div_(255.0)
    x = x.movedim(-1, -3)
    return (x - 0.5) / 0.25


def say(*parts) -> None:
    print(*parts, file=sys.stderr if False else sys.stdout, flush=True)


HERE = Path(__file__).resolve().parent


def qwen_video_inputs(model, frames: torch.Tensor, prompt_tokens: int = 24, seed: int = 0) -> dict:
    """What Qwen2VLProcessor returns for one video: ``frames`` is (T, 3, H, W) normalised float32,
    T even, H and W multiples of 28. Patchified like Qwen2VLImageProcessor (temporal patch 2,
    spatial patch 14, 2x2 merge), with one <|video_pad|> per merged patch."""
    cfg = model.config
    vc = cfg.vision_config
    p, tp, m = vc.patch_size, vc.temporal_patch_size, vc.spatial_merge_size
    t, c, h, w = frames.shape
    gt, gh, gw = t // tp, h // p, w // p
    x = frames.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (gt, gh/m, gw/m, m, m, C, tp, p, p)
    pixel_values_videos = x.reshape(gt * gh * gw, c * tp * p * p).contiguous()
    n_video = gt * gh * gw // (m * m)
    vocab = cfg.get_text_config().vocab_size
    words = text_ids(prompt_tokens - 2, vocab - 4, seed=seed)[0].tolist()
    lead = words[: len(words) // 4]
    rows = (
        lead
        + [cfg.vision_start_token_id]
        + [cfg.video_token_id] * n_video
        + [cfg.vision_end_token_id]
        + words[len(lead) :]
    )
    input_ids = torch.tensor([rows], dtype=torch.long)
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "mm_token_type_ids": (input_ids == cfg.video_token_id).int() * 2,
        "pixel_values_videos": pixel_values_videos,
        "video_grid_thw": torch.tensor([[gt, gh, gw]], dtype=torch.long),
    }


def resize(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Bilinear resize of (..., 3, H, W) float images, like a processor's resize step."""
    lead = x.shape[:-3]
    y = torch.nn.functional.interpolate(x.reshape(-1, *x.shape[-3:]), size=(h, w), mode="bilinear", align_corners=False)
    return y.reshape(*lead, 3, h, w)
