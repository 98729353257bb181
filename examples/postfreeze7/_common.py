"""Shared helpers for the second post-freeze evaluation corpus (files starting with ``_`` are not cases).

Tiny models are built from plain transformers configs with random weights; nothing is downloaded.
The multimodal ones follow the recipe of ``memwarden.models.zoo`` (special tokens at the top of the
vocabulary, sdpa attention) with widths, vocabularies and resolutions chosen per case. Processors
and feature extractors need downloads, so the few steps the cases rely on (Qwen-VL ``smart_resize``
and patchifying, InternVL-style tiling, a Whisper-style log-mel front end, a text "tokenizer") are
re-implemented here on plain tensors and arrays.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import transformers

from memwarden.models import zoo

PAD_ID, BOS_ID, EOS_ID = zoo.PAD_ID, zoo.BOS_ID, zoo.EOS_ID
FIRST_TEXT_ID = zoo.FIRST_TEXT_ID
MiB = 1024 * 1024


# ------------------------------------------------------------------------------------------------
# configs and builders


def text_config(hidden=64, layers=2, vocab=1024, heads=None, kv_heads=None, ffn=None, **extra) -> dict:
    """A Llama/Qwen2/Gemma-style decoder config dict with 16-wide heads by default."""
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
        "max_position_embeddings": 32768,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        **extra,
    }


def llava(image_px=32, patch_px=8, vision_hidden=32, vision_layers=2, seed=0, **text) -> torch.nn.Module:
    """LLaVA-1.5 style (CLIP ViT, penultimate layer, CLS dropped + MLP projector + Llama)."""
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
    return zoo.build_from_config("llava", cfg, seed=seed)


def llava_tokens_per_image(model) -> int:
    vc = model.config.vision_config
    return (vc.image_size // vc.patch_size) ** 2


def llava_prompt(model, n_images: int, prompt_tokens: int = 24, seed: int = 0) -> torch.Tensor:
    """(1, T) ids: BOS, a short lead-in, one run of <image> placeholders per image, the question."""
    vocab = model.config.get_text_config().vocab_size
    words = text_ids(prompt_tokens, vocab - 1, seed=seed)[0].tolist()
    img = [model.config.image_token_id] * llava_tokens_per_image(model)
    rows = [BOS_ID] + words[:4]
    for _ in range(n_images):
        rows += img + words[4:6]
    rows += words[6:]
    return torch.tensor([rows])


def qwen_vl(kind="qwen2-vl", vision_hidden=32, vision_layers=2, seed=0, dtype=torch.float32, **text) -> torch.nn.Module:
    """Qwen2-VL or Qwen2.5-VL style (dynamic-resolution ViT, 2x2 merger, Qwen2 with M-RoPE)."""
    t = text_config(**text)
    half = t["head_dim"] // 2
    spatial = (half - half // 4) // 2
    t["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 1_000_000.0,
        "mrope_section": [half - 2 * spatial, spatial, spatial],
    }
    vocab = t["vocab_size"]
    if kind == "qwen2-vl":
        vision = {
            "depth": vision_layers,
            "embed_dim": vision_hidden,
            "num_heads": 2,
            "mlp_ratio": 2,
            "hidden_size": t["hidden_size"],
        }
        cfg_cls = transformers.Qwen2VLConfig
    else:
        vision = {
            "depth": vision_layers,
            "hidden_size": vision_hidden,
            "num_heads": 2,
            "intermediate_size": 2 * vision_hidden,
            "out_hidden_size": t["hidden_size"],
            "window_size": 112,
            "fullatt_block_indexes": [vision_layers - 1],
        }
        cfg_cls = transformers.Qwen2_5_VLConfig
    cfg = cfg_cls(
        vision_config={"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, **vision},
        text_config=t,
        vision_start_token_id=vocab - 4,
        vision_end_token_id=vocab - 3,
        image_token_id=vocab - 2,
        video_token_id=vocab - 1,
    )
    cfg.native_image_px = 112
    return zoo.build_from_config(kind, cfg, dtype=dtype, seed=seed)


def paligemma(image_px=64, patch_px=8, vision_hidden=32, seed=0, **text) -> torch.nn.Module:
    """PaliGemma style (SigLIP ViT without head + linear projector + Gemma, prefix-LM)."""
    t = text_config(**text)
    cfg = transformers.PaliGemmaConfig(
        vision_config={
            "model_type": "siglip_vision_model",
            "image_size": image_px,
            "patch_size": patch_px,
            "hidden_size": vision_hidden,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 2 * vision_hidden,
            "vision_use_head": False,
        },
        text_config={"model_type": "gemma", **t},
        image_token_index=t["vocab_size"] - 1,
        vocab_size=t["vocab_size"],
        projection_dim=t["hidden_size"],
        hidden_size=t["hidden_size"],
    )
    return zoo.build_from_config("paligemma", cfg, seed=seed)


def qwen2_audio(window_s=10.0, audio_hidden=64, audio_layers=2, seed=0, **text) -> torch.nn.Module:
    """Qwen2-Audio style (Whisper-like encoder over a fixed mel window + projector + Qwen2)."""
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


def _seeded(fn, seed):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return fn()


def whisper(d_model=128, layers=2, vocab=2048, window_s=30.0, seed=0, attn="sdpa") -> torch.nn.Module:
    """A Whisper-style encoder-decoder (80 mel bins, conv stride 2) with random weights, eval mode."""
    frames = int(window_s * 100)
    cfg = transformers.WhisperConfig(
        vocab_size=vocab,
        num_mel_bins=80,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=max(d_model // 32, 1),
        decoder_attention_heads=max(d_model // 32, 1),
        encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model,
        max_source_positions=frames // 2,
        max_target_positions=448,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
    )
    model = _seeded(
        lambda: transformers.WhisperForConditionalGeneration._from_config(cfg, attn_implementation=attn), seed
    )
    gc = model.generation_config
    gc.decoder_start_token_id = BOS_ID
    gc.pad_token_id = PAD_ID
    gc.eos_token_id = EOS_ID
    gc.forced_decoder_ids = None
    gc.begin_suppress_tokens = []
    gc.suppress_tokens = []
    gc.max_length = 448
    return model.eval()


def wav2vec2_ctc(hidden=256, layers=4, vocab=64, seed=0) -> torch.nn.Module:
    """A wav2vec2-style CTC model (conv feature encoder + transformer), the kind used for alignment."""
    cfg = transformers.Wav2Vec2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 1),
        intermediate_size=4 * hidden,
        conv_dim=(128, 128, 128, 128, 128, 128, 128),
        num_conv_pos_embeddings=32,
        num_conv_pos_embedding_groups=4,
        pad_token_id=0,
    )
    return _seeded(lambda: transformers.Wav2Vec2ForCTC._from_config(cfg, attn_implementation="sdpa"), seed).eval()


def clip(image_px=96, patch_px=8, hidden=128, layers=3, vocab=4096, proj=128, seed=0) -> torch.nn.Module:
    """A CLIP dual encoder (ViT image tower + text tower + projections)."""
    cfg = transformers.CLIPConfig(
        text_config={
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": 4 * hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": max(hidden // 32, 1),
            "max_position_embeddings": 77,
            "pad_token_id": PAD_ID,
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
        },
        vision_config={
            "image_size": image_px,
            "patch_size": patch_px,
            "hidden_size": hidden,
            "intermediate_size": 4 * hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": max(hidden // 32, 1),
        },
        projection_dim=proj,
    )
    return _seeded(lambda: transformers.CLIPModel._from_config(cfg, attn_implementation="sdpa"), seed).eval()


# ------------------------------------------------------------------------------------------------
# text, images, audio


def text_ids(n: int, vocab_top: int, seed: int = 0) -> torch.Tensor:
    """(1, n) ordinary text token ids (below the special ids at the top of the vocabulary)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(FIRST_TEXT_ID, vocab_top, (1, n), generator=g)


def tokenize(text: str, vocab_top: int) -> list[int]:
    """A stand-in tokenizer: one deterministic id per word (processors need downloads)."""
    span = vocab_top - FIRST_TEXT_ID
    return [FIRST_TEXT_ID + (sum(ord(ch) * 31**i for i, ch in enumerate(w)) % span) for w in text.split()]


def fake_rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A decoded RGB image or video frame as PIL/decord returns it: (H, W, 3) uint8."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def normalize(frames: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 (..., H, W, 3) -> float32 (..., 3, H, W), mean/std normalised like an image processor."""
    x = torch.as_tensor(np.ascontiguousarray(frames)).float().div_(255.0)
    x = x.movedim(-1, -3)
    return (x - 0.5) / 0.25


def resize(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Bilinear resize of (..., 3, H, W) float images."""
    lead = x.shape[:-3]
    y = torch.nn.functional.interpolate(x.reshape(-1, *x.shape[-3:]), size=(h, w), mode="bilinear", align_corners=False)
    return y.reshape(*lead, 3, h, w)


def smart_resize(h: int, w: int, factor: int = 28, min_pixels: int = 4 * 28 * 28, max_pixels: int | None = None):
    """qwen_vl_utils.smart_resize: round to multiples of ``factor``; keep h*w in [min_pixels, max_pixels]."""
    hb = max(factor, round(h / factor) * factor)
    wb = max(factor, round(w / factor) * factor)
    if max_pixels is not None and hb * wb > max_pixels:
        beta = math.sqrt((h * w) / max_pixels)
        hb = max(factor, math.floor(h / beta / factor) * factor)
        wb = max(factor, math.floor(w / beta / factor) * factor)
    elif hb * wb < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        hb = math.ceil(h * beta / factor) * factor
        wb = math.ceil(w * beta / factor) * factor
    return hb, wb


def _patchify(cfg, frames: torch.Tensor):
    vc = cfg.vision_config
    p, tp, m = vc.patch_size, vc.temporal_patch_size, vc.spatial_merge_size
    t, c, h, w = frames.shape
    gt, gh, gw = t // tp, h // p, w // p
    x = frames.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * tp * p * p).contiguous(), (gt, gh, gw), gt * gh * gw // (m * m)


def qwen_inputs(model, images=(), videos=(), prompt_tokens=24, seed=0, text_after=None) -> dict:
    """What Qwen2VLProcessor returns for a user turn with ``images`` ((3, H, W) float, H and W multiples
    of 28) and ``videos`` ((T, 3, H, W), T even): patchified pixels, grids, one pad token per merged
    patch between <|vision_start|> and <|vision_end|>, then the question text."""
    cfg = model.config
    vocab = cfg.get_text_config().vocab_size
    words = text_ids(prompt_tokens, vocab - 4, seed=seed)[0].tolist()
    rows = words[:4]
    out = {}
    pix, grids = [], []
    for img in images:
        frames = img.unsqueeze(0).expand(cfg.vision_config.temporal_patch_size, -1, -1, -1)
        pv, g, n = _patchify(cfg, frames)
        pix.append(pv)
        grids.append(g)
        rows += [cfg.vision_start_token_id] + [cfg.image_token_id] * n + [cfg.vision_end_token_id]
    if pix:
        out["pixel_values"] = torch.cat(pix)
        out["image_grid_thw"] = torch.tensor(grids, dtype=torch.long)
    vpix, vgrids = [], []
    for vid in videos:
        pv, g, n = _patchify(cfg, vid)
        vpix.append(pv)
        vgrids.append(g)
        rows += [cfg.vision_start_token_id] + [cfg.video_token_id] * n + [cfg.vision_end_token_id]
    if vpix:
        out["pixel_values_videos"] = torch.cat(vpix)
        out["video_grid_thw"] = torch.tensor(vgrids, dtype=torch.long)
    rows += words[4:] if text_after is None else text_after
    ids = torch.tensor([rows], dtype=torch.long)
    mm = torch.zeros_like(ids, dtype=torch.int)
    mm[ids == cfg.image_token_id] = 1
    mm[ids == cfg.video_token_id] = 2
    out.update(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=mm)
    return out


def fake_speech(seconds: float, sr: int = 16000, seed: int = 0) -> np.ndarray:
    """A mono float32 waveform as soundfile/librosa return it."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr), dtype=np.float32) / sr
    return (0.1 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.shape[0])).astype(np.float32)


_MEL_CACHE: dict = {}


def log_mel(wave: np.ndarray, n_mels: int = 80, frames: int | None = None) -> torch.Tensor:
    """A Whisper-style front end: 25 ms window, 10 ms hop, log-mel, padded or cut to ``frames``.
    Returns (n_mels, frames) float32."""
    x = torch.from_numpy(wave)
    spec = torch.stft(x, n_fft=400, hop_length=160, window=torch.hann_window(400), return_complex=True)
    power = spec.abs() ** 2  # (201, T)
    fb = _MEL_CACHE.get(n_mels)
    if fb is None:
        fb = _seeded(lambda: torch.rand(n_mels, power.shape[0]) / power.shape[0], 1234)
        _MEL_CACHE[n_mels] = fb
    mel = torch.log10(torch.clamp(fb @ power, min=1e-10))[:, :-1]
    mel = (torch.maximum(mel, mel.max() - 8.0) + 4.0) / 4.0
    if frames is not None:
        if mel.shape[1] < frames:
            mel = torch.nn.functional.pad(mel, (0, frames - mel.shape[1]))
        mel = mel[:, :frames]
    return mel.contiguous()


def mib(n_bytes: float) -> str:
    return f"{n_bytes / MiB:.1f} MiB"


def pil_resize(rgb: np.ndarray, h: int, w: int) -> np.ndarray:
    """Resize a decoded (H, W, 3) uint8 image with PIL (bicubic), as image processors do before rescaling."""
    from PIL import Image

    return np.array(Image.fromarray(rgb).resize((w, h), Image.BICUBIC))


# ------------------------------------------------------------------------------------------------
# additions for the third corpus


def closest_grid(aspect: float, max_num: int, area: float = 0.0, tile: int = 448, min_num: int = 1) -> tuple[int, int]:
    """InternVL ``find_closest_aspect_ratio``: the (cols, rows) tile grid with at most ``max_num``
    tiles whose aspect ratio is nearest the image's (ties go to the larger grid when the image has
    the pixels for it)."""
    grids = sorted(
        {
            (i, j)
            for n in range(min_num, max_num + 1)
            for i in range(1, n + 1)
            for j in range(1, n + 1)
            if min_num <= i * j <= max_num
        },
        key=lambda g: g[0] * g[1],
    )
    best, best_diff = (1, 1), float("inf")
    for g in grids:
        diff = abs(aspect - g[0] / g[1])
        if diff < best_diff:
            best, best_diff = g, diff
        elif diff == best_diff and area > 0.5 * tile * tile * g[0] * g[1]:
            best = g
    return best


def internvl_tiles(img: torch.Tensor, tile: int, max_num: int, use_thumbnail: bool = True) -> torch.Tensor:
    """InternVL ``dynamic_preprocess`` on a (3, H, W) float image: resize to a grid of ``tile``-pixel
    tiles (at most ``max_num``), cut it, and add a thumbnail when there is more than one tile.
    Returns (N, 3, tile, tile)."""
    h, w = img.shape[-2:]
    cols, rows = closest_grid(w / h, max_num, area=h * w, tile=tile)
    big = resize(img, rows * tile, cols * tile)
    tiles = big.reshape(3, rows, tile, cols, tile).permute(1, 3, 0, 2, 4).reshape(rows * cols, 3, tile, tile)
    if use_thumbnail and rows * cols > 1:
        tiles = torch.cat([tiles, resize(img, tile, tile).unsqueeze(0)])
    return tiles.contiguous()


def qwen_turn(model, ids: torch.Tensor) -> dict:
    """Masks for a text-only continuation of a Qwen-VL conversation whose pixels are already cached."""
    cfg = model.config
    mm = torch.zeros_like(ids, dtype=torch.int)
    mm[ids == cfg.image_token_id] = 1
    mm[ids == cfg.video_token_id] = 2
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mm_token_type_ids": mm}


# ------------------------------------------------------------------------------------------------
# additions for the fourth (held-out) corpus


def idefics3(image_px=64, patch_px=8, scale=2, vision_hidden=32, seed=0, **text) -> torch.nn.Module:
    """SmolVLM / Idefics3 style (SigLIP-like ViT + pixel-shuffle connector + Llama), one global image
    per frame: (image_px / patch_px)^2 / scale^2 tokens per image."""
    t = text_config(**text)
    vocab = t["vocab_size"]
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
        image_token_id=vocab - 1,
        scale_factor=scale,
        pad_token_id=PAD_ID,
    )
    return zoo.build_from_config("idefics3", cfg, seed=seed)


def idefics3_image_block(model) -> list[int]:
    """Idefics3Processor without splitting: <fake><global-img><image>*N<fake>."""
    cfg = model.config
    vc = cfg.vision_config
    n = int((vc.image_size // vc.patch_size) ** 2 / cfg.scale_factor**2)
    img = cfg.image_token_id
    return [img - 2, img - 1] + [img] * n + [img - 2]


def normalize_float(img: torch.Tensor) -> torch.Tensor:
    """(3, H, W) float in [0, 1] -> mean/std normalised like an image processor."""
    return (img - 0.5) / 0.5


# ------------------------------------------------------------------------------------------------
# additions for the fifth (held-out) corpus


def gemma3(
    image_px=64, patch_px=4, mm_tokens=64, vision_hidden=32, seed=0, dtype=torch.float32, **text
) -> torch.nn.Module:
    """Gemma 3 style (SigLIP ViT, avg-pooled to ``mm_tokens`` per image + Gemma 3 with sliding/global layers)."""
    t = text_config(**text)
    vocab = t["vocab_size"]
    hd = t["head_dim"]
    n = t["num_hidden_layers"]
    t.update(
        query_pre_attn_scalar=hd,
        sliding_window=512,
        layer_types=["full_attention" if i % 6 == 5 or i == n - 1 else "sliding_attention" for i in range(n)],
    )
    cfg = transformers.Gemma3Config(
        vision_config={
            "model_type": "siglip_vision_model",
            "image_size": image_px,
            "patch_size": patch_px,
            "hidden_size": vision_hidden,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 2 * vision_hidden,
            "vision_use_head": False,
        },
        text_config=t,
        mm_tokens_per_image=mm_tokens,
        boi_token_index=vocab - 3,
        eoi_token_index=vocab - 2,
        image_token_index=vocab - 1,
    )
    return zoo.build_from_config("gemma3", cfg, dtype=dtype, seed=seed)


def gemma3_inputs(model, n_images: int = 1, prompt_tokens: int = 16, seed: int = 0) -> dict:
    """What Gemma3Processor returns for one user turn: BOS, text, per image <boi><img>*N<eoi>, question."""
    cfg = model.config
    vocab = cfg.text_config.vocab_size
    words = text_ids(prompt_tokens, vocab - 3, seed=seed)[0].tolist()
    rows = [BOS_ID] + words[:3]
    for _ in range(n_images):
        rows += [cfg.boi_token_id] + [cfg.image_token_id] * cfg.mm_tokens_per_image + [cfg.eoi_token_id]
    rows += words[3:]
    ids = torch.tensor([rows])
    tt = (ids == cfg.image_token_id).long()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": tt}


def mllama(image_px=56, patch_px=14, max_tiles=4, vision_hidden=32, seed=0, **text) -> torch.nn.Module:
    """Llama 3.2 Vision style (tiled ViT with tile embeddings + cross-attention layers in the LM)."""
    t = text_config(**text)
    vocab = t["vocab_size"]
    layers = t["num_hidden_layers"]
    t.update(model_type="mllama_text_model", cross_attention_layers=[layers - 1], rope_theta=500000.0)
    cfg = transformers.MllamaConfig(
        vision_config={
            "image_size": image_px,
            "patch_size": patch_px,
            "hidden_size": vision_hidden,
            "num_hidden_layers": 2,
            "num_global_layers": 1,
            "attention_heads": 2,
            "intermediate_size": 2 * vision_hidden,
            "vision_output_dim": 2 * vision_hidden,
            "max_num_tiles": max_tiles,
            "intermediate_layers_indices": [0],
            "supported_aspect_ratios": [
                [a, b] for a in range(1, max_tiles + 1) for b in range(1, max_tiles + 1) if a * b <= max_tiles
            ],
        },
        text_config=t,
        image_token_index=vocab - 1,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.MllamaForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
    model.generation_config.pad_token_id = PAD_ID
    return model.eval()


def mllama_tiles(img: torch.Tensor, tile: int, max_tiles: int):
    """MllamaImageProcessor in short: fit (3, H, W) onto the smallest canvas of (rows, cols) tiles with
    rows*cols <= max_tiles that holds it (up to the largest), cut into tiles, pad to max_tiles.
    Returns pixel_values (1, 1, max_tiles, 3, tile, tile), aspect_ratio_ids, aspect_ratio_mask, n_tiles."""
    h, w = img.shape[-2:]
    ratios = [(a, b) for a in range(1, max_tiles + 1) for b in range(1, max_tiles + 1) if a * b <= max_tiles]
    fits = [r for r in ratios if r[0] * tile >= h and r[1] * tile >= w]
    if fits:
        rows, cols = min(fits, key=lambda r: (r[0] * r[1], r))
    else:
        rows, cols = max(ratios, key=lambda r: (min(r[0] * tile / h, r[1] * tile / w), -r[0] * r[1]))
    big = resize(img, rows * tile, cols * tile)
    tiles = big.reshape(3, rows, tile, cols, tile).permute(1, 3, 0, 2, 4).reshape(rows * cols, 3, tile, tile)
    n = rows * cols
    pv = torch.zeros(1, 1, max_tiles, 3, tile, tile)
    pv[0, 0, :n] = tiles
    ar_id = ratios.index((rows, cols)) + 1
    mask = torch.zeros(1, 1, max_tiles, dtype=torch.long)
    mask[0, 0, :n] = 1
    return pv, torch.tensor([[ar_id]]), mask, n


def siglip(image_px=64, patch_px=8, hidden=64, layers=2, vocab=2048, seed=0) -> torch.nn.Module:
    """A SigLIP dual encoder (ViT image tower with attention-pool head + text tower)."""
    cfg = transformers.SiglipConfig(
        text_config={
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": max(hidden // 32, 1),
            "max_position_embeddings": 64,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
        },
        vision_config={
            "image_size": image_px,
            "patch_size": patch_px,
            "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": max(hidden // 32, 1),
        },
    )
    return _seeded(lambda: transformers.SiglipModel._from_config(cfg, attn_implementation="sdpa"), seed).eval()


def blip_captioner(
    image_px=96, patch_px=8, hidden=64, layers=2, vocab=2048, seed=0, text_layers=None
) -> torch.nn.Module:
    """A BLIP captioning model (ViT + BERT-style text decoder with cross-attention)."""
    cfg = transformers.BlipConfig(
        vision_config={
            "image_size": image_px,
            "patch_size": patch_px,
            "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": 2,
        },
        text_config={
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_hidden_layers": text_layers or layers,
            "num_attention_heads": 2,
            "encoder_hidden_size": hidden,
            "pad_token_id": PAD_ID,
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "sep_token_id": EOS_ID,
        },
    )
    model = _seeded(lambda: transformers.BlipForConditionalGeneration._from_config(cfg), seed)
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.bos_token_id = BOS_ID
    model.config.text_config.bos_token_id = BOS_ID
    model.decoder_input_ids = BOS_ID
    return model.eval()


def wav2vec2_classifier(hidden=128, layers=4, num_labels=12, seed=0, kind="wav2vec2") -> torch.nn.Module:
    """A wav2vec2 / HuBERT audio classifier (conv feature encoder + transformer + mean-pool head)."""
    common = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 1),
        intermediate_size=4 * hidden,
        conv_dim=(64,) * 7,
        num_conv_pos_embeddings=32,
        num_conv_pos_embedding_groups=4,
        num_labels=num_labels,
        classifier_proj_size=64,
    )
    if kind == "hubert":
        cfg = transformers.HubertConfig(**common)
        cls = transformers.HubertForSequenceClassification
    else:
        cfg = transformers.Wav2Vec2Config(**common)
        cls = transformers.Wav2Vec2ForSequenceClassification
    return _seeded(lambda: cls._from_config(cfg, attn_implementation="sdpa"), seed).eval()


def saved_checkpoint(builder: str, kwargs: dict, tag: str) -> str:
    """Write a safetensors checkpoint (+ config) of ``getattr(C, builder)(**kwargs)`` once, in a child
    process so the caller's resident memory is not touched; returns the folder."""
    import os
    import subprocess
    import sys as _sys

    folder = os.path.join("/tmp", "heldout5_ckpt", tag)
    if os.path.exists(os.path.join(folder, "model.safetensors")):
        return folder
    os.makedirs(folder, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import _common as C; import safetensors.torch as st\n"
        f"m = getattr(C, {builder!r})(**{kwargs!r})\n"
        f"m.config.save_pretrained({folder!r})\n"
        f"st.save_file({{k: v.contiguous() for k, v in m.state_dict().items()}}, {folder!r} + '/model.safetensors')\n"
    )
    subprocess.run([_sys.executable, "-c", code], check=True)
    return folder


def gemma3_pan_and_scan(
    img: torch.Tensor, size: int, max_num_crops: int = 4, min_crop_size: int = 256, min_ratio: float = 1.2
) -> list[torch.Tensor]:
    """Gemma3ImageProcessor.pan_and_scan on a (3, H, W) float image: for a non-square image, cut it
    into 2..max_num_crops crops along the long side. Returns the crops (each still unresized)."""
    h, w = img.shape[-2:]
    if w >= h:
        if w / h < min_ratio:
            return []
        n_w = int(math.floor(w / h + 0.5))
        n_w = min(int(math.floor(w / min_crop_size)), n_w)
        n_w = min(max_num_crops, max(2, n_w))
        n_h = 1
    else:
        if h / w < min_ratio:
            return []
        n_h = int(math.floor(h / w + 0.5))
        n_h = min(int(math.floor(h / min_crop_size)), n_h)
        n_h = min(max_num_crops, max(2, n_h))
        n_w = 1
    cw, ch = int(math.ceil(w / n_w)), int(math.ceil(h / n_h))
    if min(cw, ch) < min_crop_size:
        return []
    return [img[:, j * ch : (j + 1) * ch, i * cw : (i + 1) * cw] for j in range(n_h) for i in range(n_w)]


# ------------------------------------------------------------------------------------------------
# additions for the sixth (held-out) corpus


def _build(cls_name: str, cfg, seed: int = 0, dtype=torch.float32) -> torch.nn.Module:
    cls = getattr(transformers, cls_name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls._from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = PAD_ID
        model.generation_config.eos_token_id = EOS_ID
        model.generation_config.bos_token_id = BOS_ID
    return model.eval()


def _vit(image_px, patch_px, hidden, layers=2, heads=2, **extra) -> dict:
    return {
        "image_size": image_px,
        "patch_size": patch_px,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": 2 * hidden,
        **extra,
    }


def idefics2(
    image_px=256, patch_px=8, vision_hidden=32, latents=16, seed=0, dtype=torch.float32, **text
) -> torch.nn.Module:
    """Idefics2 style (SigLIP-like ViT with patch attention mask over padded images + perceiver
    resampler to ``latents`` tokens per image + Mistral)."""
    t = text_config(**text)
    vocab = t["vocab_size"]
    cfg = transformers.Idefics2Config(
        vision_config=_vit(image_px, patch_px, vision_hidden),
        text_config={"model_type": "mistral", **t},
        perceiver_config={
            "resampler_n_latents": latents,
            "resampler_depth": 1,
            "resampler_n_heads": 2,
            "resampler_head_dim": 16,
            "num_key_value_heads": 1,
            "hidden_size": t["hidden_size"],
        },
        image_token_id=vocab - 1,
    )
    return _build("Idefics2ForConditionalGeneration", cfg, seed, dtype)


def idefics2_image_block(model) -> list[int]:
    """Idefics2Processor: <fake><image>*latents<fake> for one image (no splitting)."""
    img = model.config.image_token_id
    n = model.config.perceiver_config.resampler_n_latents
    return [img - 1] + [img] * n + [img - 1]


def mistral3(
    patch_px=16, merge=2, vision_hidden=32, vision_layers=2, max_image_px=1024, seed=0, dtype=torch.float32, **text
):
    """Mistral-Small-3.1 / Pixtral style (Pixtral ViT with 2D RoPE + patch merger + Mistral)."""
    t = text_config(**text)
    vocab = t["vocab_size"]
    cfg = transformers.Mistral3Config(
        vision_config={
            "model_type": "pixtral",
            "hidden_size": vision_hidden,
            "intermediate_size": 2 * vision_hidden,
            "num_hidden_layers": vision_layers,
            "num_attention_heads": 2,
            "head_dim": vision_hidden // 2,
            "image_size": max_image_px,
            "patch_size": patch_px,
        },
        text_config={"model_type": "mistral", **t},
        image_token_index=vocab - 1,
        spatial_merge_size=merge,
        vision_feature_layer=-1,
    )
    return _build("Mistral3ForConditionalGeneration", cfg, seed, dtype)


def mistral3_inputs(model, image: torch.Tensor, prompt_ids: list[int]) -> dict:
    """What PixtralProcessor returns for one image (3, H, W) (H, W multiples of patch*merge) and a
    question: [IMG]*cols then [IMG_BREAK] per row, [IMG_END] after the last row."""
    cfg = model.config
    unit = cfg.vision_config.patch_size * cfg.spatial_merge_size
    h, w = image.shape[-2:]
    rows, cols = h // unit, w // unit
    img = cfg.image_token_id
    block = []
    for r in range(rows):
        block += [img] * cols + [img - 1 if r < rows - 1 else img - 2]
    ids = torch.tensor([[BOS_ID] + block + prompt_ids])
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": image.unsqueeze(0),
        "image_sizes": torch.tensor([[h, w]]),
    }


def internvl(image_px=64, patch_px=8, vision_hidden=32, vision_layers=2, seed=0, dtype=torch.float32, **text):
    """InternVL (InternViT + pixel-shuffle 0.5 + MLP + Qwen2): (image_px/patch_px)^2/4 tokens per tile."""
    t = text_config(**text)
    vocab = t["vocab_size"]
    cfg = transformers.InternVLConfig(
        vision_config={
            "hidden_size": vision_hidden,
            "num_hidden_layers": vision_layers,
            "num_attention_heads": 2,
            "intermediate_size": 2 * vision_hidden,
            "image_size": [image_px, image_px],
            "patch_size": [patch_px, patch_px],
        },
        text_config={"model_type": "qwen2", **t},
        image_token_id=vocab - 1,
    )
    return _build("InternVLForConditionalGeneration", cfg, seed, dtype)


def internvl_tokens_per_tile(model) -> int:
    vc = model.config.vision_config
    return int((vc.image_size[0] // vc.patch_size[0]) ** 2 * model.config.downsample_ratio**2)


def aya_vision(image_px=64, patch_px=8, vision_hidden=64, vision_layers=2, seed=0, dtype=torch.float32, **text):
    """Aya Vision style (SigLIP2-like ViT + pixel-shuffle x2 + SwiGLU projector + Cohere2)."""
    t = text_config(**text)
    vocab = t["vocab_size"]
    cfg = transformers.AyaVisionConfig(
        vision_config={"model_type": "siglip_vision_model", **_vit(image_px, patch_px, vision_hidden, vision_layers)},
        text_config={"model_type": "cohere2", **t},
        image_token_index=vocab - 1,
        downsample_factor=2,
        adapter_layer_norm_eps=1e-6,
    )
    return _build("AyaVisionForConditionalGeneration", cfg, seed, dtype)


def aya_tokens_per_image(model) -> int:
    vc = model.config.vision_config
    return (vc.image_size // vc.patch_size) ** 2 // model.config.downsample_factor**2


def blip2(image_px=64, patch_px=8, vision_hidden=64, queries=32, seed=0, kind="blip2", **text) -> torch.nn.Module:
    """BLIP-2 (ViT + Q-Former with ``queries`` learned queries + OPT) or InstructBLIP (+ Llama)."""
    vision = _vit(image_px, patch_px, vision_hidden)
    qformer = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        encoder_hidden_size=vision_hidden,
        vocab_size=1024,
    )
    if kind == "blip2":
        t = text_config(**text)
        tc = {
            "model_type": "opt",
            "vocab_size": t["vocab_size"],
            "hidden_size": t["hidden_size"],
            "num_hidden_layers": t["num_hidden_layers"],
            "num_attention_heads": t["num_attention_heads"],
            "ffn_dim": t["intermediate_size"],
            "word_embed_proj_dim": t["hidden_size"],
            "max_position_embeddings": 2048,
            "pad_token_id": PAD_ID,
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
        }
        cfg = transformers.Blip2Config(
            vision_config=vision,
            qformer_config=qformer,
            text_config=tc,
            num_query_tokens=queries,
            image_token_index=t["vocab_size"] - 1,
        )
        name = "Blip2ForConditionalGeneration"
    else:
        t = text_config(**text)
        cfg = transformers.InstructBlipConfig(
            vision_config=vision,
            qformer_config=qformer,
            text_config={"model_type": "llama", **t},
            num_query_tokens=queries,
            image_token_index=t["vocab_size"] - 1,
        )
        name = "InstructBlipForConditionalGeneration"
    return _build(name, cfg, seed)


def blip2_prompt(model, words: list[int]) -> list[int]:
    """Blip2Processor / InstructBlipProcessor: num_query_tokens image tokens, then BOS and the prompt."""
    return [model.config.image_token_id] * model.config.num_query_tokens + [BOS_ID] + words


def kosmos2(image_px=64, patch_px=8, vision_hidden=32, latents=64, vocab=4096, hidden=64, layers=2, seed=0):
    """Kosmos-2 (CLIP ViT + perceiver-like connector to ``latents`` tokens + grounded text decoder)."""
    cfg = transformers.Kosmos2Config(
        vision_config=_vit(image_px, patch_px, vision_hidden),
        text_config=dict(
            vocab_size=vocab,
            embed_dim=hidden,
            layers=layers,
            attention_heads=max(hidden // 32, 1),
            ffn_dim=2 * hidden,
            pad_token_id=PAD_ID,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            max_position_embeddings=2048,
        ),
        latent_query_num=latents,
    )
    return _build("Kosmos2ForConditionalGeneration", cfg, seed)


def kosmos2_inputs(model, words: list[int], batch: int = 1) -> dict:
    """Kosmos2Processor: <s><image> [latents slots] </image> text; the mask marks the image slots."""
    n = model.config.latent_query_num
    ids = [BOS_ID, 3] + [4] * n + [5] + words
    mask = [0, 0] + [1] * n + [0] + [0] * len(words)
    ids = torch.tensor([ids] * batch)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "image_embeds_position_mask": torch.tensor([mask] * batch),
    }


def pix2struct(hidden=64, layers=2, vocab=2048, patch_px=16, seed=0) -> torch.nn.Module:
    """Pix2Struct / DePlot / MatCha (variable-resolution ViT over flattened patches + T5-style decoder)."""
    cfg = transformers.Pix2StructConfig(
        vision_config=dict(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=2,
            d_ff=2 * hidden,
            d_kv=hidden // 2,
            patch_embed_hidden_size=3 * patch_px * patch_px,
            seq_len=8192,
        ),
        text_config=dict(
            vocab_size=vocab,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=2,
            d_ff=2 * hidden,
            d_kv=hidden // 2,
            pad_token_id=PAD_ID,
            eos_token_id=EOS_ID,
            decoder_start_token_id=PAD_ID,
        ),
        decoder_start_token_id=PAD_ID,
        pad_token_id=PAD_ID,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.Pix2StructForConditionalGeneration._from_config(cfg)
    model.generation_config.decoder_start_token_id = PAD_ID
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.eos_token_id = EOS_ID
    return model.eval()


def pix2struct_patches(img: torch.Tensor, max_patches: int, patch_px: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Pix2StructImageProcessor.extract_flattened_patches on a (3, H, W) float image: rescale keeping the
    aspect ratio so that at most ``max_patches`` patches fit, cut patches, prepend (row, col) ids, pad to
    ``max_patches``. Returns flattened_patches (max_patches, 2 + 3*p*p) and attention_mask (max_patches,)."""
    h, w = img.shape[-2:]
    scale = math.sqrt(max_patches * (patch_px / h) * (patch_px / w))
    rows = max(min(math.floor(scale * h / patch_px), max_patches), 1)
    cols = max(min(math.floor(scale * w / patch_px), max_patches), 1)
    x = resize(img, rows * patch_px, cols * patch_px)
    p = x.reshape(3, rows, patch_px, cols, patch_px).permute(1, 3, 2, 4, 0).reshape(rows * cols, -1)
    rid = torch.arange(rows).repeat_interleave(cols).float().unsqueeze(1) + 1
    cid = torch.arange(cols).repeat(rows).float().unsqueeze(1) + 1
    flat = torch.cat([rid, cid, p], dim=1)
    out = torch.zeros(max_patches, flat.shape[1])
    out[: flat.shape[0]] = flat
    mask = torch.zeros(max_patches)
    mask[: flat.shape[0]] = 1
    return out, mask


def speecht5_asr(hidden=128, layers=2, vocab=96, seed=0) -> torch.nn.Module:
    """SpeechT5 for speech-to-text (conv feature encoder on the raw waveform + encoder-decoder)."""
    cfg = transformers.SpeechT5Config(
        vocab_size=vocab,
        hidden_size=hidden,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=max(hidden // 64, 1),
        decoder_attention_heads=max(hidden // 64, 1),
        encoder_ffn_dim=4 * hidden,
        decoder_ffn_dim=4 * hidden,
        conv_dim=(128,) * 7,
        max_speech_positions=8000,
        max_text_positions=600,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.SpeechT5ForSpeechToText._from_config(cfg)
    gc_ = model.generation_config
    gc_.decoder_start_token_id = BOS_ID
    gc_.pad_token_id = PAD_ID
    gc_.eos_token_id = EOS_ID
    gc_.bos_token_id = BOS_ID
    return model.eval()


def git_captioner(
    image_px=64, patch_px=8, vision_hidden=64, hidden=64, layers=2, vocab=2048, seed=0
) -> torch.nn.Module:
    """GIT (CLIP ViT image encoder + visual projection + BERT-style causal decoder over [image; text])."""
    cfg = transformers.GitConfig(
        vision_config=_vit(image_px, patch_px, vision_hidden),
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.GitForCausalLM._from_config(cfg)
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.bos_token_id = BOS_ID
    return model.eval()


def ast_encoder(hidden=64, layers=2, frames=1024, mels=128, seed=0) -> torch.nn.Module:
    """Audio Spectrogram Transformer encoder (16x16 patches, stride 10, over (frames, mels) fbanks)."""
    cfg = transformers.ASTConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 32, 1),
        intermediate_size=2 * hidden,
        max_length=frames,
        num_mel_bins=mels,
    )
    return _seeded(lambda: transformers.ASTModel._from_config(cfg, attn_implementation="sdpa"), seed).eval()


def saved_pretrained(builder: str, kwargs: dict, tag: str, cast: str | None = None) -> str:
    """Write ``getattr(C, builder)(**kwargs)`` with save_pretrained once, in a child process (so the
    caller's resident memory is not touched); returns the folder."""
    import os
    import subprocess
    import sys as _sys

    folder = os.path.join("/tmp", "heldout6_ckpt", tag)
    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    os.makedirs(folder, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import _common as C\n"
        f"m = getattr(C, {builder!r})(**{kwargs!r})\n"
        + (f"m = m.to(getattr(__import__('torch'), {cast!r}))\n" if cast else "")
        + f"m.save_pretrained({folder!r})\n"
    )
    subprocess.run([_sys.executable, "-c", code], check=True)
    return folder


# ------------------------------------------------------------------------------------------------
# additions for the seventh (held-out) corpus


def onevision(image_px=32, patch_px=8, vision_hidden=32, pinpoints=None, seed=0, dtype=torch.float32, **text):
    """LLaVA-OneVision style (SigLIP ViT, anyres_max_9 grid of base-resolution crops + base view,
    2-layer MLP projector, Qwen2)."""
    t = text_config(**text)
    vocab = t["vocab_size"]
    px = image_px
    pinpoints = pinpoints or [[px * a, px * b] for a in range(1, 4) for b in range(1, 4)]
    cfg = transformers.LlavaOnevisionConfig(
        vision_config={"model_type": "siglip_vision_model", **_vit(image_px, patch_px, vision_hidden)},
        text_config={"model_type": "qwen2", **t},
        image_token_index=vocab - 1,
        video_token_index=vocab - 2,
        image_grid_pinpoints=pinpoints,
        vision_aspect_ratio="anyres_max_9",
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
    )
    return _build("LlavaOnevisionForConditionalGeneration", cfg, seed, dtype)


def onevision_image_processor(model):
    """LlavaOnevisionImageProcessor configured like the checkpoint's preprocessor_config.json (no download)."""
    cfg = model.config
    px = cfg.vision_config.image_size
    return transformers.LlavaOnevisionImageProcessor(
        size={"height": px, "width": px}, image_grid_pinpoints=cfg.image_grid_pinpoints, do_convert_rgb=True
    )


@torch.no_grad()
def onevision_placeholders(model, pixel_values, image_sizes) -> list[int]:
    """How many <image> tokens LlavaOnevisionProcessor writes per image (base view + unpadded grid +
    row newlines, anyres_max_9 downsampling): counted from the model's own feature packing."""
    f = model.model.get_image_features(
        pixel_values=pixel_values,
        image_sizes=image_sizes,
        vision_feature_layer=model.config.vision_feature_layer,
        vision_feature_select_strategy=model.config.vision_feature_select_strategy,
    )
    feats = f.pooler_output if hasattr(f, "pooler_output") else f
    return [int(x.shape[0]) for x in feats]


def onevision_inputs(model, pixel_values, image_sizes, words: list[int], counts=None) -> dict:
    """One user turn per row: BOS, the image placeholders, the question words."""
    counts = counts or onevision_placeholders(model, pixel_values, image_sizes)
    img = model.config.image_token_id
    rows = [[BOS_ID] + [img] * n + words for n in counts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD_ID)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):  # left padding, as for generation
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": pixel_values, "image_sizes": image_sizes}


def video_llava(image_px=32, patch_px=8, vision_hidden=32, vision_layers=2, seed=0, dtype=torch.float32, **text):
    """Video-LLaVA style (LanguageBind/CLIP towers for images and 8-frame videos + MLP + Llama)."""
    t = text_config(**text)
    vocab = t["vocab_size"]
    cfg = transformers.VideoLlavaConfig(
        vision_config={"model_type": "clip_vision_model", **_vit(image_px, patch_px, vision_hidden, vision_layers)},
        text_config={"model_type": "llama", **t},
        image_token_index=vocab - 1,
        video_token_index=vocab - 2,
    )
    return _build("VideoLlavaForConditionalGeneration", cfg, seed, dtype)


def video_llava_tokens_per_frame(model) -> int:
    """Video-LLaVA keeps the CLS token for video frames: (px/patch)^2 + 1 per frame."""
    vc = model.config.vision_config
    return (vc.image_size // vc.patch_size) ** 2 + 1


def llava_next_video(image_px=32, patch_px=8, vision_hidden=32, seed=0, dtype=torch.float32, **text):
    """LLaVA-NeXT-Video style (CLIP ViT, frames average-pooled with stride 2 + MLP + Llama)."""
    t = text_config(**text)
    vocab = t["vocab_size"]
    cfg = transformers.LlavaNextVideoConfig(
        vision_config={"model_type": "clip_vision_model", **_vit(image_px, patch_px, vision_hidden)},
        text_config={"model_type": "llama", **t},
        image_token_index=vocab - 1,
        video_token_index=vocab - 2,
        image_grid_pinpoints=[[image_px, image_px]],
        spatial_pool_stride=2,
    )
    return _build("LlavaNextVideoForConditionalGeneration", cfg, seed, dtype)


def llava_next_video_tokens_per_frame(model) -> int:
    vc = model.config.vision_config
    side = vc.image_size // vc.patch_size // model.config.spatial_pool_stride
    return side * side


def voxtral(audio_hidden=64, audio_layers=2, window_s=30.0, seed=0, dtype=torch.float32, **text):
    """Voxtral style (Whisper-like encoder over 30 s log-mel windows, 4x frame-stacking projector, Llama).
    Each 30 s window becomes window_s * 100 / 2 / 4 audio tokens (375 for the real model)."""
    t = text_config(**text)
    vocab = t["vocab_size"]
    cfg = transformers.VoxtralConfig(
        audio_config={
            "hidden_size": audio_hidden,
            "num_hidden_layers": audio_layers,
            "num_attention_heads": 2,
            "intermediate_size": 4 * audio_hidden,  # the projector stacks 4 frames: must be 4 * hidden
            "num_mel_bins": 128,
            "max_source_positions": int(window_s * 100 / 2),
        },
        text_config={"model_type": "llama", **t},
        audio_token_id=vocab - 1,
    )
    return _build("VoxtralForConditionalGeneration", cfg, seed, dtype)


def voxtral_tokens_per_window(model) -> int:
    return model.config.audio_config.max_source_positions // 4


def voxtral_features(wave: np.ndarray, window_s: float = 30.0) -> torch.Tensor:
    """VoxtralProcessor / WhisperFeatureExtractor: 128-bin log-mel, cut into (and the last padded to)
    whole ``window_s`` windows. Returns (n_windows, 128, window_s * 100)."""
    frames = int(window_s * 100)
    mel = log_mel(wave, n_mels=128)
    n = max(1, math.ceil(mel.shape[1] / frames))
    mel = torch.nn.functional.pad(mel, (0, n * frames - mel.shape[1]))
    return mel.reshape(128, n, frames).permute(1, 0, 2).contiguous()


def voxtral_inputs(model, features: torch.Tensor, words: list[int]) -> dict:
    """[INST][BEGIN_AUDIO] audio tokens (per window) then the instruction text."""
    n = features.shape[0] * voxtral_tokens_per_window(model)
    ids = torch.tensor([[BOS_ID] + [model.config.audio_token_id] * n + words])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "input_features": features}


def owlv2(image_px=96, patch_px=16, hidden=64, layers=2, vocab=1024, seed=0) -> torch.nn.Module:
    """OWLv2 open-vocabulary detector (CLIP-like ViT with per-patch box/class heads + text tower)."""
    cfg = transformers.Owlv2Config(
        text_config={
            "vocab_size": vocab,
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": 2,
            "intermediate_size": 2 * hidden,
            "max_position_embeddings": 16,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        vision_config=_vit(image_px, patch_px, hidden, layers),
        projection_dim=hidden,
    )
    return _seeded(
        lambda: transformers.Owlv2ForObjectDetection._from_config(cfg, attn_implementation="sdpa"), seed
    ).eval()


def sam(image_px=256, patch_px=16, hidden=64, layers=2, out_channels=32, seed=0) -> torch.nn.Module:
    """Segment Anything (windowed ViT image encoder + prompt encoder + two-way mask decoder)."""
    cfg = transformers.SamConfig(
        vision_config={
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": 2,
            "image_size": image_px,
            "patch_size": patch_px,
            "output_channels": out_channels,
            "global_attn_indexes": [layers - 1],
            "mlp_dim": 2 * hidden,
            "window_size": 4,
            "num_pos_feats": out_channels // 2,
        },
        prompt_encoder_config={"hidden_size": out_channels, "image_size": image_px, "patch_size": patch_px},
        mask_decoder_config={
            "hidden_size": out_channels,
            "num_multimask_outputs": 3,
            "mlp_dim": 2 * out_channels,
            "num_attention_heads": 2,
            "iou_head_hidden_dim": out_channels,
        },
    )
    return _seeded(lambda: transformers.SamModel._from_config(cfg, attn_implementation="sdpa"), seed).eval()


def saved_checkpoint7(builder: str, kwargs: dict, tag: str, dtype: str | None = None) -> str:
    """Write ``getattr(C, builder)(**kwargs)`` with save_pretrained under /tmp/heldout7_ckpt/<tag>, once,
    from a child process (the caller's resident memory is not touched); returns the folder."""
    import os
    import subprocess
    import sys as _sys

    folder = os.path.join("/tmp", "heldout7_ckpt", tag)
    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    os.makedirs(folder, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import _common as C; import torch\n"
        f"m = getattr(C, {builder!r})(**{kwargs!r})\n"
        + (f"m = m.to(getattr(torch, {dtype!r}))\n" if dtype else "")
        + f"m.save_pretrained({folder!r})\n"
    )
    subprocess.run([_sys.executable, "-c", code], check=True)
    return folder
