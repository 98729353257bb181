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

from memwarden.capture.inputs import tensor_digest

# Placeholder token id attributes by modality, as transformers configs name them.
_PLACEHOLDER_KEYS = {
    "image": ("image_token_id", "image_token_index"),
    "video": ("video_token_id", "video_token_index"),
    "audio": ("audio_token_id", "audio_token_index"),
}
# Processor outputs that carry each modality's content (first dim = items where splittable).
MEDIA_KEYS = {
    "image": ("pixel_values", "image_sizes", "image_grid_thw", "pixel_attention_mask", "spatial_shapes",
              "pixel_position_ids", "image_attention_mask"),
    "video": ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts"),
    "audio": ("input_features", "feature_attention_mask", "input_features_mask", "audio_values"),
}  # fmt: skip
# Models whose positions depend on where the media sit (multimodal rope): their cached text after a
# media item is only valid with the position deltas of the call that computed it, so reuse stops
# before the first item.
_MROPE_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v", "qwen2_5_omni")


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


def _fingerprints(tensors: list[torch.Tensor], count: int, split: bool) -> list[str]:
    """Fingerprints of ``count`` items, one per row of every tensor (``split``) or one for all of them.

    Hashing a 336 px image costs ~10 ms and a session plans each request at least once: the prints
    are kept per tensor identity and version (a chat sends the same image tensor every turn; an
    in-place change bumps ``_version``, so a stale print is never reused)."""
    try:
        key = (count, split) + tuple(
            (id(t), t.data_ptr(), t._version, tuple(t.shape), tuple(t.stride()), t.dtype) for t in tensors
        )
    except RuntimeError:  # a tensor without storage: no identity to key on
        key = None
    hit = _PRINTS.get(key) if key is not None else None
    if hit is not None and all(ref() is t for ref, t in zip(hit[0], tensors, strict=True)):
        return hit[1]
    if split:
        prints = [_digest([t[i] for t in tensors]) for i in range(count)]
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


def media_items(config: Any, ids: list[int], inputs: dict[str, Any]) -> list[MediaItem]:
    """Media items of one sequence (``inputs`` are its processor tensors), in token order."""
    items: list[MediaItem] = []
    for modality, token in placeholder_ids(config).items():
        tensors = media_tensors(inputs, modality)
        runs = _runs(ids, token)
        if not runs:
            continue
        prints = _fingerprints(list(tensors.values()), len(runs), splittable(inputs, modality, len(runs)))
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


def reuse_boundary(items: list[MediaItem], cached_tokens: int, block_size: int, config: Any,
                   inputs: dict[str, Any]) -> int:  # fmt: skip
    """Largest reusable prefix (a multiple of ``block_size``, ≤ ``cached_tokens``) that cuts no item
    in half and leaves the media after it passable to the model."""
    h = cached_tokens
    if not items:
        return h
    first = min(it.start for it in items)
    if positions_are_media_dependent(config) and h > first:
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
        if before and len(before) < len(its) and not splittable(inputs, modality, len(its)):
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
        else:  # splittable by reuse_boundary's rule
            out.update({k: t[keep[0] :] for k, t in tensors.items()})
    return out
