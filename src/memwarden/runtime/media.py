"""Where a request's images, videos and audio sit among its tokens, and what they are.

Prefix reuse needs two facts about every media item: the token span of its placeholders
(so a reused prefix never cuts an item in half) and a content fingerprint (so a block's hash
changes when the picture does, even though the placeholder token ids are the same). Both come
from the model's config (placeholder token ids) and the processor's tensors, for any
transformers VLM / audio-LM that marks media with placeholder tokens.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from memwarden.record.inputs import tensor_digest

# Placeholder token id attributes by modality, as transformers configs name them.
_PLACEHOLDER_KEYS = {
    "image": ("image_token_id", "image_token_index"),
    "video": ("video_token_id", "video_token_index"),
    "audio": ("audio_token_id", "audio_token_index"),
}
# Processor outputs that carry each modality's content (first dim = items where splittable).
MEDIA_KEYS = {
    "image": (
        "pixel_values",
        "image_sizes",
        "image_grid_thw",
        "pixel_attention_mask",
        "spatial_shapes",
        "pixel_position_ids",
        "image_attention_mask",
    ),
    "video": ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts"),
    "audio": ("input_features", "feature_attention_mask", "input_features_mask", "audio_values"),
}
# Models whose positions depend on where the media sit (multimodal rope): their cached text after a
# media item is only valid with the position deltas of the call that computed it. For the families
# in _MROPE_CONTINUED the session passes those positions itself (runtime/mrope.py); for the others
# reuse stops before the first item.
_MROPE_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v", "qwen2_5_omni")
_MROPE_CONTINUED = ("qwen2_vl", "qwen2_5_vl")


@dataclass(frozen=True, kw_only=True)
class MediaItem:
    modality: str
    index: int  # among the request's items of this modality
    start: int  # first placeholder position
    stop: int  # one past the last placeholder position
    fingerprint: str


def placeholder_ids(config: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for modality, keys in _PLACEHOLDER_KEYS.items():
        for key in keys:
            value = getattr(config, key, None)
            if isinstance(value, int):
                out[modality] = value
                break
    return out


def positions_are_media_dependent(config: Any) -> bool:
    return str(getattr(config, "model_type", "")) in _MROPE_TYPES


def positions_continued(config: Any) -> bool:
    """An M-RoPE family whose positions the session continues after a cached prefix (runtime/mrope.py)."""
    return str(getattr(config, "model_type", "")) in _MROPE_CONTINUED


def _runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, tok in enumerate(ids + [None]):
        if tok == token and start is None:
            start = i
        elif tok != token and start is not None:
            runs.append((start, i))
            start = None
    return runs


def placeholder_runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """(start, stop) of each run of ``token`` in ``ids``: one per media item."""
    return _runs(ids, token)


def _digest(values: list[torch.Tensor]) -> str:
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for v in values:
        h.update(str((tuple(v.shape), str(v.dtype))).encode())
        h.update(tensor_digest(v))
    return h.hexdigest()


_PRINTS: dict[tuple[Any, ...], tuple[list[weakref.ReferenceType[torch.Tensor]], list[str]]] = {}
_PRINTS_LIMIT = 256


def _fingerprints(tensors: list[torch.Tensor], count: int, bounds: list[list[int]] | None) -> list[str]:
    """Fingerprints of ``count`` items: item ``i`` of every tensor is its rows ``bounds[k][i]:bounds[k][i + 1]``
    (see :func:`item_rows`); one fingerprint for all of them where ``bounds`` is None.

    Hashing a 336 px image costs ~10 ms and a session plans each request at least once: the prints
    are kept per tensor identity and version (a chat sends the same image tensor every turn; an
    in-place change bumps ``_version``, so a stale print is never reused)."""
    try:
        key = (count, None if bounds is None else tuple(map(tuple, bounds))) + tuple(
            (id(t), t.data_ptr(), t._version, tuple(t.shape), tuple(t.stride()), t.dtype) for t in tensors
        )
    except RuntimeError:  # a tensor without storage: no identity to key on
        key = None
    hit = _PRINTS.get(key) if key is not None else None
    if hit is not None and all(ref() is t for ref, t in zip(hit[0], tensors, strict=True)):
        return hit[1]
    if bounds is not None:  # one row per item: the row itself (as before patch rows were split)
        prints = [
            _digest(
                [t[i] if len(b) == t.shape[0] + 1 else t[b[i] : b[i + 1]] for t, b in zip(tensors, bounds, strict=True)]
            )
            for i in range(count)
        ]
    else:  # one fingerprint for all of the modality's items: coarser, still correct
        whole = _digest(tensors) if tensors else "no-content"
        prints = [f"{whole}:{i}" for i in range(count)]
    if key is not None:
        if len(_PRINTS) >= _PRINTS_LIMIT:
            _PRINTS.clear()
        _PRINTS[key] = ([weakref.ref(t) for t in tensors], prints)
    return prints


def media_tensors(inputs: dict[str, Any], modality: str) -> dict[str, torch.Tensor]:
    return {k: inputs[k] for k in MEDIA_KEYS[modality] if isinstance(inputs.get(k), torch.Tensor)}


def splittable(inputs: dict[str, Any], modality: str, num_items: int) -> bool:
    """True where every tensor of the modality has one row per item (it can be sliced per item)."""
    tensors = media_tensors(inputs, modality)
    return bool(tensors) and all(t.dim() > 0 and t.shape[0] == num_items for t in tensors.values())


# Pixel tensors whose rows are patches, not items, and the grid that counts each item's: Qwen2-VL and
# Qwen2.5-VL flatten all images into one (patches, C*T*P*P) tensor, item i taking t*h*w rows of its grid.
_PATCH_ROWS = {"pixel_values": "image_grid_thw", "pixel_values_videos": "video_grid_thw"}


def item_rows(inputs: dict[str, Any], modality: str, num_items: int) -> dict[str, list[int]] | None:
    """Per tensor of the modality, the row each of the ``num_items`` items starts at (and one past the
    last): one row per item, or a patch tensor cut by its grid. None where some tensor cannot be cut."""
    tensors = media_tensors(inputs, modality)
    if not tensors:
        return None
    out: dict[str, list[int]] = {}
    for key, t in tensors.items():
        if t.dim() > 0 and t.shape[0] == num_items:
            out[key] = list(range(num_items + 1))
            continue
        grid = inputs.get(_PATCH_ROWS.get(key, ""))
        if not (isinstance(grid, torch.Tensor) and grid.dim() == 2 and grid.shape[0] == num_items and t.dim() > 0):
            return None
        bounds = [0]
        for rows in grid.prod(-1).tolist():
            bounds.append(bounds[-1] + int(rows))
        if bounds[-1] != t.shape[0]:
            return None
        out[key] = bounds
    return out


def media_items(config: Any, ids: list[int], inputs: dict[str, Any]) -> list[MediaItem]:
    """Media items of one sequence (``inputs`` are its processor tensors), in token order."""
    items: list[MediaItem] = []
    # Without mm_token_type_ids an M-RoPE model's generate() places the media with 1-D positions: other
    # KV than the 3-D positions a processor's full output gets, so the two never share blocks.
    tag = "|1d-positions" if positions_are_media_dependent(config) and inputs.get("mm_token_type_ids") is None else ""
    for modality, token in placeholder_ids(config).items():
        tensors = media_tensors(inputs, modality)
        runs = _runs(ids, token)
        if not runs:
            continue
        rows = item_rows(inputs, modality, len(runs))
        prints = _fingerprints(list(tensors.values()), len(runs), None if rows is None else list(rows.values()))
        if tag:
            prints = [p + tag for p in prints]
        for i, (start, stop) in enumerate(runs):
            items.append(MediaItem(modality=modality, index=i, start=start, stop=stop, fingerprint=prints[i]))
    return sorted(items, key=lambda it: it.start)


def block_extras(items: list[MediaItem], num_tokens: int, block_size: int) -> list[tuple[str, ...]]:
    """Per full block, the fingerprints of the media items it overlaps (the hash's extra keys)."""
    extras: list[tuple[str, ...]] = []
    for b in range(num_tokens // block_size):
        lo, hi = b * block_size, (b + 1) * block_size
        extras.append(tuple(it.fingerprint for it in items if it.start < hi and it.stop > lo))
    return extras


def reuse_boundary(
    items: list[MediaItem], cached_tokens: int, block_size: int, config: Any, inputs: dict[str, Any]
) -> int:
    """Largest reusable prefix (a multiple of ``block_size``, ≤ ``cached_tokens``) that cuts no item
    in half and leaves the media after it passable to the model."""
    h = cached_tokens
    if not items:
        return h
    first = min(it.start for it in items)
    if positions_are_media_dependent(config) and not positions_continued(config) and h > first:
        return (first // block_size) * block_size
    for it in items:
        if it.start < h < it.stop:  # never cut an item: recompute it whole
            h = (it.start // block_size) * block_size
    # Items after the boundary are passed again; that needs their tensors sliceable per item, or all items after it.
    by_modality: dict[str, list[MediaItem]] = {}
    for it in items:
        by_modality.setdefault(it.modality, []).append(it)
    for modality, its in by_modality.items():
        before = [it for it in its if it.stop <= h]
        if before and len(before) < len(its) and item_rows(inputs, modality, len(its)) is None:
            h = min(h, (its[0].start // block_size) * block_size)
    return h


def inputs_after(inputs: dict[str, Any], items: list[MediaItem], boundary: int) -> dict[str, Any]:
    """The request's media tensors for the items at or after ``boundary`` (none if all are cached)."""
    out: dict[str, Any] = {}
    for modality in MEDIA_KEYS:
        its = [it for it in items if it.modality == modality]
        tensors = media_tensors(inputs, modality)
        keep = [it.index for it in its if it.start >= boundary]
        if not tensors or not keep:
            continue
        if len(keep) == len(its):
            out.update(tensors)
        else:  # cut per item by reuse_boundary's rule
            rows = item_rows(inputs, modality, len(its))
            assert rows is not None
            out.update({k: t[rows[k][keep[0]] :] for k, t in tensors.items()})
    return out
