"""The projector (``mmproj`` GGUF) of a llama.cpp multimodal deployment: its weights, the image
tokens an image of W x H px becomes, and the compute buffer reserved for the warmup image.

Sources (llama.cpp ``tools/mtmd/``): ``clip.cpp`` ``clip_model_loader::load_hparams`` (per projector:
``n_merge``, the token limits of ``set_limit_image_tokens``, ``warmup_image_size`` from
``set_warmup_n_tokens``), ``clip-model.h`` (those helpers), ``mtmd.cpp`` ``mtmd_context::init_vision``
(which preprocessor each projector uses), ``mtmd-image.cpp`` (the preprocessors:
``mtmd_image_preprocessor_fixed_size``, ``_dyn_size``, ``_idefics3``, and
``img_tool::calc_size_preserved_ratio``), ``clip.cpp`` ``clip_n_output_tokens`` (tokens per
preprocessed image), ``clip.cpp`` ``load_tensors`` (weights loaded into an allocated buffer, no mmap)
and ``warmup``/``reserve_compute_meta`` (the compute buffer is reserved for the warmup image).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from memwarden.errors import InputError
from memwarden.estimation.gguf.reader import GGUFHeader
from memwarden.untrusted import terminal_safe

__all__ = ["Projector", "image_tokens", "projector"]

# Projector types whose image rules are modelled (clip-impl.h PROJECTOR_TYPE_NAMES).
DYN_SIZE = {"qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger"}  # mtmd_image_preprocessor_dyn_size
FIXED_SIZE = {"mlp", "mlp_norm", "gemma3"}  # mtmd_image_preprocessor_fixed_size
TILED = {"idefics3"}  # mtmd_image_preprocessor_idefics3
WINDOW_ATTENTION = {"qwen2.5vl_merger"}  # n_wa_pattern: full layers between windowed ones, a patches^2 mask
SUPPORTED = DYN_SIZE | FIXED_SIZE | TILED


@dataclass(frozen=True, kw_only=True)
class Projector:
    proj_type: str
    weights_bytes: int  # "model size" clip.cpp logs: the tensors' bytes (the buffer adds <= 31 B each)
    image_size: int
    patch_size: int
    n_merge: int  # patch merge per side (Qwen: spatial_merge_size; Gemma 3 / Idefics3: scale factor)
    n_embd: int
    n_ff: int
    n_head: int
    n_layer: int
    proj_dim: int  # embedding size handed to the language model
    min_pixels: int  # dyn_size limits (set_limit_image_tokens x patch area); -1: none
    max_pixels: int
    longest_edge: int  # idefics3: clip.vision.preproc_image_size
    warmup_size: int  # side of the square image the compute buffer is reserved for


def _int(header: GGUFHeader, key: str, default: int | None = None) -> int:
    value = header.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 20:
        raise InputError(
            f"{header.path}: {terminal_safe(key)} = {terminal_safe(repr(value))[:40]} (expected an integer)"
        )
    return value


def projector(header: GGUFHeader, *, image_min_tokens: int = -1, image_max_tokens: int = -1) -> Projector:
    if header.get("general.architecture") != "clip":
        raise InputError(f"{header.path}: not a projector file (general.architecture is not 'clip')")
    if not header.get("clip.has_vision_encoder", False):
        raise InputError(f"{header.path}: no vision encoder in this projector (audio projectors are not estimated yet)")
    proj = header.get("clip.vision.projector_type", header.get("clip.projector_type"))
    if not isinstance(proj, str):
        raise InputError(f"{header.path}: clip.projector_type is missing")
    if proj not in SUPPORTED:
        raise InputError(
            f"{header.path}: projector type {terminal_safe(proj)!r} is not estimated yet "
            f"(supported: {', '.join(sorted(SUPPORTED))})"
        )
    image_size = _int(header, "clip.vision.image_size")
    patch = _int(header, "clip.vision.patch_size")
    if patch <= 0 or image_size <= 0:
        raise InputError(f"{header.path}: clip.vision.patch_size and image_size must be positive")
    n_merge = 1
    min_px = max_px = -1
    longest = 0
    warmup = image_size  # clip.cpp load_hparams: "default warmup value"
    if proj in DYN_SIZE:  # load_hparams: n_merge 2 unless the file says; set_limit_image_tokens(8, 4096)
        n_merge = _int(header, "clip.vision.spatial_merge_size", 2) or 2
        area = patch * patch * n_merge * n_merge
        min_px = (image_min_tokens if image_min_tokens > 0 else 8) * area
        max_px = (image_max_tokens if image_max_tokens > 0 else 4096) * area
        warmup = 46 * patch * n_merge  # set_warmup_n_tokens(46*46): the custom limits do not change it
    elif proj == "gemma3":  # n_merge = 4 unless clip.vision.projector.scale_factor says otherwise
        n_merge = _int(header, "clip.vision.projector.scale_factor", 4) or 4
    elif proj == "idefics3":
        n_merge = _int(header, "clip.vision.projector.scale_factor", 1) or 1
        longest = _int(header, "clip.vision.preproc_image_size", 0)
        area = patch * patch * n_merge * n_merge
        if image_min_tokens > 0:  # set_limit_image_tokens(): only custom values
            min_px = image_min_tokens * area
        if image_max_tokens > 0:
            max_px = image_max_tokens * area
    # clip.cpp load_hparams logs "model size" as the tensors' ggml_nbytes, unaligned
    weights = sum(t.nbytes for t in header.tensors)
    return Projector(
        proj_type=proj,
        weights_bytes=weights,
        image_size=image_size,
        patch_size=patch,
        n_merge=n_merge,
        n_embd=_int(header, "clip.vision.embedding_length"),
        n_ff=_int(header, "clip.vision.feed_forward_length", 0),
        n_head=max(1, _int(header, "clip.vision.attention.head_count", 1)),
        n_layer=_int(header, "clip.vision.block_count", 0),
        proj_dim=_int(header, "clip.vision.projection_dim", 0),
        min_pixels=min_px,
        max_pixels=max_px,
        longest_edge=longest,
        warmup_size=warmup,
    )


_f32 = np.float32


def _cround(x: np.float32) -> int:
    """std::round on a float: halves away from zero (Python's round is to even)."""
    return int(math.floor(float(x) + 0.5)) if x >= 0 else -int(math.floor(-float(x) + 0.5))


def preserved_ratio(
    width: int, height: int, align: int, min_px: int, max_px: int, longest_edge: int = 0
) -> tuple[int, int]:
    """mtmd-image.cpp ``img_tool::calc_size_preserved_ratio``, in float32 as the C++ computes it."""
    if width <= 0 or height <= 0:
        return 0, 0
    fa = _f32(align)

    def by(fn: str, x: np.float32) -> int:
        q = _f32(x) / fa
        return (math.ceil(q) if fn == "ceil" else math.floor(q) if fn == "floor" else _cround(q)) * align

    if longest_edge > 0:
        scale = min(_f32(longest_edge) / _f32(width), _f32(longest_edge) / _f32(height))
        w_bar, h_bar = by("ceil", _f32(width) * scale), by("ceil", _f32(height) * scale)
    else:
        w_bar, h_bar = max(align, by("round", _f32(width))), max(align, by("round", _f32(height)))
    if max_px > 0 and h_bar * w_bar > max_px:
        beta = np.sqrt(_f32(height) * _f32(width) / _f32(max_px), dtype=_f32)
        h_bar = max(align, by("floor", _f32(height) / beta))
        w_bar = max(align, by("floor", _f32(width) / beta))
    elif min_px > 0 and h_bar * w_bar < min_px:
        beta = np.sqrt(_f32(min_px) / (_f32(height) * _f32(width)), dtype=_f32)
        h_bar = by("ceil", _f32(height) * beta)
        w_bar = by("ceil", _f32(width) * beta)
    return w_bar, h_bar


def tokens_for(p: Projector, nx: int, ny: int) -> int:
    """clip.cpp ``clip_n_output_tokens`` for one preprocessed image of nx x ny px."""
    n_patches = (nx // p.patch_size) * (ny // p.patch_size)
    if p.proj_type in DYN_SIZE:  # "dynamic size (2 conv, so double patch size)"
        return (nx // (p.patch_size * 2)) * (ny // (p.patch_size * 2))
    if p.proj_type in ("gemma3", "idefics3"):  # "both X and Y are downscaled by the scale factor"
        return n_patches // (p.n_merge * p.n_merge)
    return n_patches  # mlp, mlp_norm: one token per patch


@dataclass(frozen=True)
class ImagePlan:
    width: int
    height: int
    tokens: int  # image embeddings handed to the language model (not the marker tokens around them)
    encodes: tuple[tuple[int, int], ...]  # each image the encoder runs on (tiles and overview)


def image_tokens(p: Projector, width: int, height: int) -> ImagePlan:
    """The image of ``width x height`` px as the projector's preprocessor cuts it, and its tokens."""
    if width <= 0 or height <= 0:
        raise InputError(f"--image {width}x{height}: give a positive size")
    if p.proj_type in DYN_SIZE:  # mtmd_image_preprocessor_dyn_size::preprocess
        w, h = preserved_ratio(width, height, p.patch_size * p.n_merge, p.min_pixels, p.max_pixels)
        return ImagePlan(width, height, tokens_for(p, w, h), ((w, h),))
    if p.proj_type in FIXED_SIZE:  # mtmd_image_preprocessor_fixed_size: resized (padded) to image_size^2
        s = p.image_size
        return ImagePlan(width, height, tokens_for(p, s, s), ((s, s),))
    return _idefics3(p, width, height)


def _idefics3(p: Projector, width: int, height: int) -> ImagePlan:
    """mtmd_image_preprocessor_idefics3::preprocess: tiles of image_size after resizing the longest
    side to preproc_image_size (rounded up to whole tiles), plus an overview of image_size."""
    tile = p.image_size
    if p.longest_edge > 0 and p.min_pixels <= 0 and p.max_pixels <= 0:
        aspect = float(width) / height  # a double in the C++
        if width >= height:
            rw, rh = p.longest_edge, int(p.longest_edge / aspect)
            rh += rh % 2
        else:
            rh, rw = p.longest_edge, int(p.longest_edge * aspect)
            rw += rw % 2
        gx, gy = -(-rw // tile), -(-rh // tile)
    else:
        rw, rh = preserved_ratio(width, height, tile, max(0, p.min_pixels), max(0, p.max_pixels), p.longest_edge)
        gx, gy = math.ceil(float(_f32(rw) / _f32(tile))), math.ceil(float(_f32(rh) / _f32(tile)))
    per_tile = tokens_for(p, tile, tile)
    encodes = ((tile, tile),) * (gx * gy + 1)
    return ImagePlan(width, height, per_tile * (gx * gy + 1), encodes)


def compute_bytes(p: Projector, flash_attn: bool) -> int:
    """The vision graph's high-water mark for the warmup image (clip.cpp ``warmup``: the buffer is
    reserved once, for ``warmup_image_size`` squared, whatever the user's image).

    ggml-alloc (``ggml_gallocr_alloc_graph_impl``) places the graph inputs first and frees every
    tensor, inputs included, after its last use, so the peak is the largest of three moments:

    - the patch embedding: the raw image (3 planes f32, ``build_inp_raw``), the other inputs and
      ``ggml_conv_2d``'s im2col (3 p^2 x patches, f16), plus for Qwen-VL (two temporal convs,
      ``clip_graph_qwen2vl::build_inp_with_temporal_merge``) the first conv's product;
    - Qwen2.5-VL's window attention: the patches^2 f32 ``window_mask`` input and its f16 copy
      (``clip_graph_qwen2vl::build``, cast when flash attention is on) live together;
    - a layer: the residual and attention (patches^2 x heads f32 scores without flash
      attention) or the FFN, the image long freed.

    Measured against llama-mtmd-cli (docs/llama-cpp-accuracy.md): Qwen2-VL, Qwen2.5-VL and
    Gemma 3 exact to the logged 0.01 MiB; the layer term is not exercised by the tiny towers."""
    side = p.warmup_size
    n = (side // p.patch_size) ** 2  # patches
    f32 = 4
    image = 3 * side * side * f32  # (W, H, 3) f32
    im2col = 3 * p.patch_size * p.patch_size * n * 2  # (3 p^2, patches) f16
    resid = n * p.n_embd * f32  # (n_embd, patches)
    other_inputs = 0
    mask_stage = 0
    if p.proj_type in DYN_SIZE:
        other_inputs = 4 * n * 4  # m-rope positions, 4 per patch (i32)
        if p.proj_type in WINDOW_ATTENTION:
            other_inputs += 2 * (n // 4) * 4 + n * n * f32  # window_idx, inv_window_idx, window_mask
            if flash_attn:
                mask_stage = image + other_inputs + n * n * 2
        embed = image + other_inputs + im2col + resid  # conv 0's product is live at conv 1
    else:
        embed = image + other_inputs + im2col
    if flash_attn:
        attn = 4 * resid
    else:
        attn = 2 * resid + n * n * p.n_head * f32 + resid
    ffn = resid * 2 + 2 * n * max(p.n_ff, p.n_embd) * f32
    layer = other_inputs + max(attn, ffn)
    return max(embed, mask_stage, layer)
