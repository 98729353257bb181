"""Suggested changes priced by running the meta estimate again with the change (exact, like the
estimate itself): the checkpoint's dtype, quantized weights and KV cache (emulated), and the
largest image of the request's aspect ratio that fits."""

from __future__ import annotations

from typing import Any

from memwarden.estimation.card import MemoryCard, Request, Suggestion
from memwarden.estimation.measure import WEIGHT_DTYPES, card_for
from memwarden.estimation.resolve import ResolvedModel
from memwarden.units import DTYPE_BYTES

__all__ = ["image_multiple", "replace_request", "rerun_suggestions"]

_SUGGEST_IMAGE_STEPS = 6  # re-runs spent searching for the largest image that fits


def rerun_suggestions(resolved: ResolvedModel, req: Request, card: MemoryCard, device: Any) -> list[Suggestion]:
    """Exact predictions: quantized weights and KV cache (emulated), and the largest image that fits."""
    out: list[Suggestion] = []
    usable = int(device.usable_bytes)
    checkpoint = resolved.checkpoint_dtype
    if checkpoint is not None and DTYPE_BYTES[req.dtype] > DTYPE_BYTES[checkpoint]:
        peak = card_for(resolved, replace_request(req, dtype=checkpoint))[0].peak_bytes
        out.append(
            Suggestion.priced(
                "dtype",
                f"use the checkpoint's dtype ({checkpoint}; the request ran in {req.dtype})",
                {"dtype": checkpoint},
                peak,
                usable,
                "rerun",
                "meta estimate re-run in the dtype config.json states",
            )
        )

    for qdtype in WEIGHT_DTYPES:
        if req.weights_dtype == "int4" or req.weights_dtype == qdtype:
            continue
        peak = card_for(resolved, replace_request(req, weights_dtype=qdtype))[0].peak_bytes
        card.suggestions = [s for s in card.suggestions if s.setting != {"weights_dtype": qdtype}]
        out.append(
            Suggestion.priced(
                "weights_dtype",
                f"{qdtype} weights (weight-only quantization of every linear layer)",
                {"weights_dtype": qdtype},
                peak,
                usable,
                "rerun",
                "meta estimate re-run with emulated quantized linears",
            )
        )
    from memwarden.estimation.metamodel import kv_quantizable

    if req.kv_dtype is None and card.kv_cache_bytes and kv_quantizable(resolved):
        peak = card_for(resolved, replace_request(req, kv_dtype="int8"))[0].peak_bytes
        card.suggestions = [s for s in card.suggestions if s.kind != "kv_dtype"]
        out.append(
            Suggestion.priced(
                "kv_dtype",
                "int8 KV cache (quantized cache, 128-token residual window)",
                {"kv_dtype": "int8"},
                peak,
                usable,
                "rerun",
                "meta estimate re-run with an emulated quantized cache",
            )
        )
    best = _largest_image(resolved, req, usable) if card.weights_bytes < usable else None
    if best is not None:
        wh, peak = best
        out.append(
            Suggestion.priced(
                "max_image",
                f"images of at most {wh[0]}x{wh[1]} px",
                {"images": [list(wh)]},
                peak,
                usable,
                "rerun",
                "largest size of the request's aspect ratio that fits, by re-running the estimate",
            )
        )
    return out


def image_multiple(resolved: ResolvedModel) -> int | None:
    """patch x merge of a dynamic-resolution (Qwen-VL style) vision tower; None for a fixed or tiled one."""
    vc = getattr(resolved.config, "vision_config", None)
    patch, merge = getattr(vc, "patch_size", None), getattr(vc, "spatial_merge_size", None)
    if not isinstance(patch, int) or not isinstance(merge, int) or not hasattr(vc, "temporal_patch_size"):
        return None
    return patch * merge


def replace_request(req: Request, **changes: Any) -> Request:
    data = {k: getattr(req, k) for k in req.__dataclass_fields__}
    data.update(changes)
    return Request(**data)


def _largest_image(resolved: ResolvedModel, req: Request, usable: int) -> tuple[tuple[int, int], int] | None:
    """Binary search over the request's image scaled down in steps of the model's image multiple."""
    if not req.images or image_multiple(resolved) is None:
        return None
    multiple = int(image_multiple(resolved) or 1)
    w, h = req.images[0]
    top = max(w, h) // multiple  # size in multiples along the long side
    lo, hi, best = 1, top, None
    for _ in range(_SUGGEST_IMAGE_STEPS):
        if lo > hi:
            break
        mid = (lo + hi) // 2
        scale = mid / top
        wh = (
            max(multiple, round(w * scale / multiple) * multiple),
            max(multiple, round(h * scale / multiple) * multiple),
        )
        peak = card_for(resolved, replace_request(req, images=(wh,)))[0].peak_bytes
        if peak <= usable:
            best, lo = (wh, peak), mid + 1
        else:
            hi = mid - 1
    return best
