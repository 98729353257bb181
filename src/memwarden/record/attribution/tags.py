"""Stage 4: the Python side's tags (this storage is a weight, a gradient, the KV cache, an
input) matched to the blocks they name, and what they decide.

A tag is (t_ns, ptr, kind, module path). Its block is the one at that address alive at that
time; a tag that names no block names a storage alive before the capture (a preexisting
weight) or nothing the capture holds. When several tags name one block, the strongest kind wins:
weight/buffer > optimizer_state > gradient > kv_cache > input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from memwarden.record.attribution.log import SAVED, StorageRecord
from memwarden.record.attribution.recorded import Blocks
from memwarden.record.modality import ModalityRules
from memwarden.trace.model import Category, Modality

__all__ = [
    "KIND_CATEGORY",
    "KIND_PRIORITY",
    "UNTAGGED",
    "PreexistingTag",
    "Tagged",
    "apply_tags",
    "match_tags",
    "saved_for_backward",
    "split_saved",
]

Tag = tuple[int, int, str, str]  # (t_ns, ptr, kind, module path)

KIND_PRIORITY = {
    "weight": 6,
    "buffer": 6,
    "optimizer_state": 5,
    "gradient": 4,
    "kv_cache": 3,
    "input": 2,
    "state": 1,  # a state dict handed to load_state_dict (record.foreign.state_dict_hook)
}
KIND_CATEGORY = {
    "weight": Category.WEIGHT,
    "buffer": Category.BUFFER,
    "optimizer_state": Category.OPTIMIZER_STATE,
    "gradient": Category.GRADIENT,
    "kv_cache": Category.KV_CACHE,
    "input": Category.INPUT,
    "state": Category.OTHER,
}
_OWNED = ("weight", "buffer", "gradient", "optimizer_state")  # kinds whose block belongs to the tag's module
_PARAMETER = ("weight", "buffer")


@dataclass(frozen=True)
class PreexistingTag:
    """What a storage alive before the capture is, from the strongest tag that named it."""

    category: Category
    modality: Modality
    module: str | None  # the owning module's path, for a weight or buffer


UNTAGGED = PreexistingTag(category=Category.OTHER, modality=Modality.SHARED, module=None)


@dataclass(frozen=True)
class Tagged:
    """The stage's decisions: per-block arrays with the tags applied, and the preexisting storages' attribution."""

    category: np.ndarray  # int64 Category per block
    modality: np.ndarray  # int64 Modality per block
    module_paths: dict[int, str]  # block index -> the module owning it (parameters, grads, optimizer state)
    preexisting: dict[int, PreexistingTag]  # ptr -> attribution; a storage no tag named is absent
    # Per side record (``CaptureLog.side_records()``: mapped, then foreign): its attribution, or
    # None for a foreign storage that is an allocator block's memory wrapped again
    # (``torch.from_numpy(t.numpy())``), which the block already counts.
    side: list[PreexistingTag | None]


def match_tags(tags: Sequence[Tag], blocks: Blocks) -> list[int | None]:
    """Per tag, the index of the block at its address allocated last at or before its time, if
    that block is still alive then; None otherwise."""
    if not tags:
        return []
    # One sorted key per block, (address, alloc time) as a single int64: the address's rank among
    # the blocks' addresses, then the time's rank among their alloc times. A tag's key built the
    # same way finds, by one binary search, the block at its address allocated last before it.
    times = np.sort(blocks.alloc_ns)
    ptrs = np.unique(blocks.ptr)
    width = len(times) + 1
    order = np.lexsort((blocks.alloc_ns, blocks.ptr))
    keys = np.searchsorted(ptrs, blocks.ptr[order]) * width + np.searchsorted(
        times, blocks.alloc_ns[order], side="right"
    )
    tag_t = np.array([tg[0] for tg in tags], dtype=np.int64)
    tag_p = np.array([tg[1] for tg in tags], dtype=np.int64)
    rank = np.searchsorted(ptrs, tag_p)
    known = (rank < len(ptrs)) & (ptrs[np.minimum(rank, len(ptrs) - 1)] == tag_p) if len(ptrs) else rank < 0
    j = np.searchsorted(keys, rank * width + np.searchsorted(times, tag_t, side="right"), side="right") - 1
    block = order[np.maximum(j, 0)] if len(order) else np.zeros(len(tags), dtype=np.int64)
    ok = known & (j >= 0)
    if len(order):
        ok &= (blocks.ptr[block] == tag_p) & (tag_t <= blocks.free_ns[block])
    return [int(b) if hit else None for b, hit in zip(block.tolist(), ok.tolist(), strict=True)]


def _strongest_preexisting(
    tags: Sequence[Tag], hits: Sequence[int | None], preexisting: Mapping[int, StorageRecord]
) -> dict[int, tuple[int, str, str]]:
    """ptr -> (rank, kind, path) of the strongest tag naming each preexisting storage while alive."""
    found: dict[int, tuple[int, str, str]] = {}
    for (t, p, kind, path), hit in zip(tags, hits, strict=True):
        rec = preexisting.get(p) if hit is None else None
        if rec is None or (rec.freed_ns is not None and t > rec.freed_ns):
            continue
        if KIND_PRIORITY[kind] > found.get(p, (0, "", ""))[0]:
            found[p] = (KIND_PRIORITY[kind], kind, path)
    return found


def _preexisting_tag(kind: str, path: str, rules: ModalityRules) -> PreexistingTag:
    if kind in _PARAMETER:
        return PreexistingTag(category=KIND_CATEGORY[kind], modality=rules.modality_of(path), module=path or None)
    return PreexistingTag(category=KIND_CATEGORY[kind], modality=Modality.SHARED, module=None)


def _side_tags(
    tags: Sequence[Tag],
    hits: Sequence[int | None],
    blocks: Blocks,
    records: Sequence[StorageRecord],
    inputs: Sequence[tuple[int, int, int]],
    rules: ModalityRules,
) -> list[PreexistingTag | None]:
    """Each side record's strongest tag while it lived; its first-seen kind when none named it."""
    by_ptr: dict[int, list[int]] = {}
    for i, rec in enumerate(records):
        by_ptr.setdefault(rec.ptr, []).append(i)
    best: dict[int, tuple[int, str, str]] = {}
    for (t, p, kind, path), hit in zip(tags, hits, strict=True):
        for i in by_ptr.get(p, ()) if hit is None else ():
            if records[i].alive_at(t) and KIND_PRIORITY[kind] > best.get(i, (0, "", ""))[0]:
                best[i] = (KIND_PRIORITY[kind], kind, path)
    wrapped = match_tags([(rec.t_ns, rec.ptr, "", "") for rec in records], blocks)
    out: list[PreexistingTag | None] = []
    for i, rec in enumerate(records):
        if wrapped[i] is not None and rec.file is None:
            out.append(None)
            continue
        _rank, kind, path = best.get(i, (0, rec.kind, ""))
        out.append(_preexisting_tag(kind, path, rules))
    for t, p, m in inputs:  # an input's modality, from the name of the argument that carried it
        for i in by_ptr.get(p, ()):
            tag = out[i]
            if tag is not None and tag.category == Category.INPUT and records[i].alive_at(t):
                out[i] = PreexistingTag(category=tag.category, modality=Modality(m), module=tag.module)
    return out


def _input_modalities(
    inputs: Sequence[tuple[int, int, int]], blocks: Blocks, category: np.ndarray, modality: np.ndarray
) -> None:
    """Set, in place, the modality of each input block from the argument that carried it."""
    hits = match_tags([(t, p, "input", "") for t, p, _m in inputs], blocks)
    for (_t, _p, m), hit in zip(inputs, hits, strict=True):
        if hit is not None and category[hit] == int(Category.INPUT):
            modality[hit] = m


def apply_tags(
    tags: Sequence[Tag],
    hits: Sequence[int | None],
    blocks: Blocks,
    category: np.ndarray,
    modality: np.ndarray,
    preexisting: Mapping[int, StorageRecord],
    rules: ModalityRules,
    side: Sequence[StorageRecord] = (),
    inputs: Sequence[tuple[int, int, int]] = (),
) -> Tagged:
    """Apply each block's strongest tag to copies of ``category`` and ``modality``. An ``input`` tag
    on a block made inside a module is ignored (the model made it, not the program). A block a
    module owns takes its modality from the owner's path by ``rules``, the capture's rules, so
    a user's rule moves parameters as it moves the activations."""
    category, modality = category.copy(), modality.copy()
    rank = np.zeros(len(blocks), dtype=np.int64)
    paths: dict[int, str] = {}
    for (_t, _p, kind, path), hit in zip(tags, hits, strict=True):
        if hit is None or (kind == "input" and blocks.ctx[hit] >= 0) or KIND_PRIORITY[kind] <= rank[hit]:
            continue
        rank[hit] = KIND_PRIORITY[kind]
        category[hit] = int(KIND_CATEGORY[kind])
        if kind in _OWNED:
            paths[hit] = path
        if kind == "kv_cache":
            modality[hit] = int(Modality.TEXT)
    for k, path in paths.items():
        modality[k] = int(rules.modality_of(path))
    _input_modalities(inputs, blocks, category, modality)
    pre = _strongest_preexisting(tags, hits, preexisting)
    pre_tags = {p: _preexisting_tag(kind, path, rules) for p, (_rank, kind, path) in pre.items()}
    for t, p, m in inputs:  # an input made before the capture: its modality from its argument's name
        tag, rec = pre_tags.get(p), preexisting.get(p)
        if tag is not None and rec is not None and tag.category == Category.INPUT and rec.alive_at(t):
            pre_tags[p] = PreexistingTag(category=tag.category, modality=Modality(m), module=tag.module)
    return Tagged(
        category=category,
        modality=modality,
        module_paths=paths,
        preexisting=pre_tags,
        side=_side_tags(tags, hits, blocks, side, inputs, rules),
    )


_NOT_ACTIVATIONS = [int(Category.WEIGHT), int(Category.BUFFER), int(Category.GRADIENT), int(Category.OPTIMIZER_STATE)]


def split_saved(tags: Sequence[Tag]) -> tuple[list[Tag], list[Tag]]:
    """The tags that decide categories, and the ``saved`` ones (autograd's pack hook), apart."""
    kinds: list[Tag] = []
    saved: list[Tag] = []
    for tg in tags:
        (saved if tg[2] == SAVED else kinds).append(tg)
    return kinds, saved


def saved_for_backward(
    saved: Sequence[Tag], blocks: Blocks, nbytes: np.ndarray, category: np.ndarray
) -> dict[str, object] | None:
    """The blocks autograd saved for backward while they were alive (activations, inputs and
    what else a forward kept for its gradient; parameters and their state are not counted):
    ``{"tensors": [block id, ...], "nbytes": total}``, None when backward saved nothing."""
    hits = np.array([-1 if h is None else h for h in match_tags(saved, blocks)], dtype=np.int64)
    hits = np.unique(hits[hits >= 0])
    hits = hits[~np.isin(category[hits], _NOT_ACTIVATIONS)]
    if not len(hits):
        return None
    return {"tensors": [int(i) for i in blocks.ids[hits]], "nbytes": int(nbytes[hits].sum())}
