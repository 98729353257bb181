"""Stage 5a: the trace's events. The allocator's rows become whole columns (a capture can hold
millions); the storages the allocator never saw (alive before the capture, mapped from a file,
foreign: numpy, buffers, DLPack) become builder rows; ``merge`` puts both in time order.

String ids are handed out in first-use order, so the order of the ``intern`` calls here fixes the
trace's string table: module labels, owners' paths, ops, dtypes, then the builder rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from memwarden.record.attribution.log import StorageRecord
from memwarden.record.attribution.phases import StepTable
from memwarden.record.attribution.recorded import Blocks, Clock, RecorderColumns
from memwarden.record.attribution.tags import KIND_CATEGORY, UNTAGGED, PreexistingTag, Tagged
from memwarden.record.foreign import EXTERNAL_OP
from memwarden.record.native import NativeRecord
from memwarden.trace.model import Action, Category, Modality, Phase, Trace, TraceBuilder
from memwarden.trace.sites import split_site

__all__ = ["DTYPE_NAMES", "allocator_columns", "intern_labels", "merge", "side_events", "site_columns"]

# c10::toString(ScalarType) -> torch dtype name
DTYPE_NAMES = {
    "Byte": "uint8",
    "Char": "int8",
    "Short": "int16",
    "Int": "int32",
    "Long": "int64",
    "Half": "float16",
    "Float": "float32",
    "Double": "float64",
    "ComplexHalf": "complex32",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
    "Bool": "bool",
    "QInt8": "qint8",
    "QUInt8": "quint8",
    "QInt32": "qint32",
    "BFloat16": "bfloat16",
    "QUInt4x2": "quint4x2",
    "QUInt2x4": "quint2x4",
    "Float8_e5m2": "float8_e5m2",
    "Float8_e4m3fn": "float8_e4m3fn",
    "UInt16": "uint16",
    "UInt32": "uint32",
    "UInt64": "uint64",
}

_MAX_NDIM = 128  # a shape key packs (pool offset, ndim) as offset * 128 + ndim


def _string_ids(builder: TraceBuilder, texts: Sequence[str]) -> np.ndarray:
    """int32 string id per text, and -1 after the last, so that index -1 (none) reads -1."""
    return np.array([builder.intern(t) for t in texts] + [-1], dtype=np.int32)


def intern_labels(builder: TraceBuilder, labels: Sequence[str]) -> np.ndarray:
    """String id per module context (its path, or a root's class name); -1 at index -1."""
    return _string_ids(builder, labels)


def _module_column(builder: TraceBuilder, blocks: Blocks, label_ids: np.ndarray, tagged: Tagged) -> np.ndarray:
    """The module of each block: the one that made it, or the one that owns it (a parameter)."""
    module = label_ids[blocks.ctx]
    for k, path in tagged.module_paths.items():
        module[k] = builder.intern(path) if path else -1
    return module


def _shape_column(builder: TraceBuilder, cols: RecorderColumns, blocks: Blocks) -> np.ndarray:
    """Interned shape per block, -1 = unknown. The recorder stores each distinct shape once in its
    pool, so shapes are interned per (offset, ndim), not per row."""
    shape = np.full(len(blocks), -1, dtype=np.int32)
    offsets = cols.shape_off[blocks.rows]
    has_shape = offsets >= 0
    keys = offsets.astype(np.int64) * _MAX_NDIM + cols.ndim[blocks.rows].astype(np.int64)
    uniq, inverse = np.unique(keys[has_shape], return_inverse=True)
    pool = cols.shape_pool
    ids_of_uniq = np.array(
        [builder.intern_shape(tuple(pool[k // _MAX_NDIM : k // _MAX_NDIM + k % _MAX_NDIM])) for k in uniq.tolist()],
        dtype=np.int32,
    )
    shape[has_shape] = ids_of_uniq[inverse] if len(uniq) else -1
    return shape


def _site_columns(builder: TraceBuilder, cols: RecorderColumns, blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
    """Per block: the interned user line and stack of its allocation (-1 = none)."""
    return site_columns(builder, cols.site_names, cols.site[blocks.rows])


def site_columns(builder: TraceBuilder, site_names: Sequence[str], site: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Recorder site ids -> (line, stack) string ids; sites interned once each, not per row."""
    pairs = [split_site(s) for s in site_names]
    line_ids = np.array([builder.intern(p[0]) for p in pairs] + [-1], dtype=np.int32)
    stack_ids = np.array([builder.intern(p[1]) for p in pairs] + [-1], dtype=np.int32)
    index = np.where((site >= 0) & (site < len(pairs)), site, -1).astype(np.int64)
    return line_ids[index], stack_ids[index]


def _event_rows(cols: RecorderColumns, blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
    """(ALLOC and FREE rows kept, the block of each). A FREE of a block allocated before the
    capture has no block and is dropped."""
    rows = np.flatnonzero((cols.action == NativeRecord.ALLOC) | (cols.action == NativeRecord.FREE))
    if not len(blocks):
        return rows[:0], rows[:0]
    block = np.clip(np.searchsorted(blocks.ids, cols.ids[rows]), 0, len(blocks) - 1)
    keep = blocks.ids[block] == cols.ids[rows]
    return rows[keep], block[keep]


def allocator_columns(
    builder: TraceBuilder,
    cols: RecorderColumns,
    blocks: Blocks,
    tagged: Tagged,
    phase: np.ndarray,
    label_ids: np.ndarray,
    dtype_names: Sequence[str],
    clock: Clock,
) -> dict[str, np.ndarray]:
    """The event columns of the allocator's rows; a FREE repeats its block's attribution."""
    module = _module_column(builder, blocks, label_ids, tagged)
    op = _string_ids(builder, cols.op_names)[cols.op_outer[blocks.rows].astype(np.int64)]
    dtype = _string_ids(builder, [DTYPE_NAMES.get(d, d) for d in dtype_names])[cols.dtype[blocks.rows].astype(np.int64)]
    shape = _shape_column(builder, cols, blocks)
    line, stack = _site_columns(builder, cols, blocks)
    rows, k = _event_rows(cols, blocks)
    free = cols.action[rows] == NativeRecord.FREE
    return {
        "time_us": clock.us_array(cols.time_ns[rows]),
        "action": np.where(free, int(Action.FREE), int(Action.ALLOC)),
        "tensor": cols.ids[rows],
        "address": cols.ptr[rows].astype(np.uint64),
        "nbytes": cols.nbytes[rows],
        "device": np.zeros(len(rows), np.int16),
        "category": tagged.category[k].astype(np.uint8),
        "modality": tagged.modality[k].astype(np.uint8),
        "phase": phase[k].astype(np.uint8),
        "module": module[k],
        "op": op[k],
        "dtype": dtype[k],
        "shape": shape[k],
        "written_bytes": cols.written[blocks.rows][k],
        "line": line[k],
        "stack": stack[k],
    }


@dataclass(frozen=True)
class _Freed:
    """A preexisting storage's release, emitted after every MAP/PREEXISTING row."""

    t_ns: int
    tensor: int
    action: Action
    ptr: int
    rec: StorageRecord
    tag: PreexistingTag


def _preexisting_rows(
    builder: TraceBuilder, preexisting: Mapping[int, StorageRecord], tags: Mapping[int, PreexistingTag], first_id: int
) -> list[_Freed]:
    """A PREEXISTING row at t = 0 per storage (MAP for one in a file), in address order, with
    tensor ids counting down from ``first_id``; returns the releases the finalizers saw."""
    freed: list[_Freed] = []
    for i, (p, rec) in enumerate(sorted(preexisting.items())):
        tensor = first_id - i
        tag = tags.get(p, UNTAGGED)
        builder.event(
            0,
            Action.MAP if rec.file else Action.PREEXISTING,
            tensor,
            p,
            rec.nbytes,
            op=rec.file,
            category=tag.category,
            modality=tag.modality,
            phase=Phase.LOAD,
            module=tag.module,
            dtype=rec.dtype,
            shape=rec.shape,
        )
        if rec.freed_ns is not None:
            freed.append(_Freed(rec.freed_ns, tensor, Action.UNMAP if rec.file else Action.FREE, p, rec, tag))
    return freed


def _side_rows(
    builder: TraceBuilder,
    records: Sequence[StorageRecord],
    tags: Sequence[PreexistingTag | None],
    first_id: int,
    clock: Clock,
    steps: StepTable | None,
) -> None:
    """MAP/UNMAP rows of the storages mapped from a file during the capture, ALLOC/FREE rows of
    the foreign ones (numpy, buffers, DLPack), from when the capture first saw each to its release.
    A weight or buffer belongs to the load phase; anything else to the step it was seen in."""
    for i, (rec, tag) in enumerate(zip(records, tags, strict=True)):
        if tag is None:  # an allocator block's memory wrapped again: the block counts it
            continue
        tensor = first_id - i
        if tag.category in (Category.WEIGHT, Category.BUFFER) or steps is None:
            phase = Phase.LOAD
        else:
            phase = Phase(int(steps.phase_at(np.array([rec.t_ns], dtype=np.int64), int(Phase.LOAD))[0]))
        actions = (Action.MAP, Action.UNMAP) if rec.file else (Action.ALLOC, Action.FREE)
        times = (rec.t_ns,) if rec.freed_ns is None else (rec.t_ns, rec.freed_ns)
        for t_ns, action in zip(times, actions, strict=False):
            builder.event(
                clock.us(t_ns),
                action,
                tensor,
                rec.ptr,
                rec.nbytes,
                category=tag.category,
                modality=tag.modality,
                phase=phase,
                module=tag.module,
                op=rec.file or EXTERNAL_OP,
                dtype=rec.dtype,
                shape=rec.shape,
            )


def side_events(
    builder: TraceBuilder,
    preexisting: Mapping[int, StorageRecord],
    tags: Mapping[int, PreexistingTag],
    side: Sequence[StorageRecord],
    clock: Clock,
    side_tags: Sequence[PreexistingTag | None] | None = None,
    steps: StepTable | None = None,
) -> None:
    """Builder rows for the storages the allocator never saw. Their tensor ids are negative
    (-1, -2, ...: preexisting first, then mapped and foreign), apart from the allocator's block
    ids. ``side_tags``: each side record's attribution (default: the kind it was first seen as)."""
    freed = _preexisting_rows(builder, preexisting, tags, -1)
    if side_tags is None:
        side_tags = [PreexistingTag(KIND_CATEGORY.get(r.kind, Category.OTHER), Modality.SHARED, None) for r in side]
    _side_rows(builder, side, side_tags, -1 - len(preexisting), clock, steps)
    for f in freed:
        builder.event(
            clock.us(f.t_ns),
            f.action,
            f.tensor,
            f.ptr,
            f.rec.nbytes,
            category=f.tag.category,
            modality=f.tag.modality,
            phase=Phase.LOAD,
            module=f.tag.module,
            op=f.rec.file,
            dtype=f.rec.dtype,
            shape=f.rec.shape,
        )


def merge(side: Trace, main_cols: dict[str, np.ndarray]) -> Trace:
    """The builder's rows (preexisting, mapped) plus the allocator's columns, in time order (a
    stable sort: at equal times builder rows come first)."""
    events = {k: np.concatenate([side.events[k], main_cols[k].astype(side.events[k].dtype)]) for k in side.events}
    order = np.argsort(events["time_us"], kind="stable")
    events = {k: v[order] for k, v in events.items()}
    return Trace(
        events=events,
        spans=side.spans,
        strings=side.strings,
        shapes=side.shapes,
        devices=side.devices,
        metadata=side.metadata,
    )
