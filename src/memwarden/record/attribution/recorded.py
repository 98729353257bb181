"""The recorder's drained log as typed columns, the blocks (allocations) it holds, and the clock
that turns its nanoseconds into a trace's microseconds: the input of every attribution stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from memwarden.record.native import NativeRecord

__all__ = ["Blocks", "Clock", "RecorderColumns"]

NEVER_NS = np.iinfo(np.int64).max  # the free time of a block still alive when the capture ends


@dataclass(frozen=True, kw_only=True)
class RecorderColumns:
    """One array per field, one row per record, in record order (the native recorder's ``drain()``,
    or the meta recorder's, which logs the same columns)."""

    action: np.ndarray  # NativeRecord codes
    time_ns: np.ndarray
    ptr: np.ndarray
    nbytes: np.ndarray
    ids: np.ndarray  # block id (ALLOC/FREE; increasing in allocation order) or module context (ENTER/EXIT)
    ctx: np.ndarray  # innermost module context when the row was logged, -1 = none
    op_outer: np.ndarray  # index into op_names of the outermost running op, -1 = none
    dtype: np.ndarray  # index into the recorder's scalar type names, -1 = unknown
    shape_off: np.ndarray  # offset of the row's shape in shape_pool, -1 = unknown
    ndim: np.ndarray
    written: np.ndarray  # bytes ops wrote into the block, -1 = unknown
    shape_pool: list[int]  # every distinct shape once, dims back to back
    op_names: list[str]
    site: np.ndarray  # index into site_names of the allocation's Python site, -1 = none
    site_names: list[str]  # recorder sites (memwarden.trace.sites.split_site reads them)
    untracked_frees: int
    unwrapped_allocations: int

    @classmethod
    def of(cls, drained: dict[str, Any]) -> RecorderColumns:
        cols = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in drained.items()}
        return cls(
            action=cols["action"],
            time_ns=cols["time_ns"],
            ptr=cols["ptr"],
            nbytes=cols["nbytes"],
            ids=cols["id"],
            ctx=cols["ctx"],
            op_outer=cols["op_outer"],
            dtype=cols["dtype"],
            shape_off=cols["shape_off"],
            ndim=cols["ndim"],
            written=cols["written"],
            shape_pool=np.asarray(cols["shapes"]).tolist(),
            op_names=list(cols["op_names"]),
            site=np.asarray(cols["site"]) if "site" in cols else np.full(len(cols["action"]), -1, np.int32),
            site_names=list(cols.get("site_names", ())),
            untracked_frees=int(cols["untracked_frees"]),
            unwrapped_allocations=int(cols["unwrapped_allocations"]),
        )

    def __len__(self) -> int:
        return len(self.action)


@dataclass(frozen=True)
class Blocks:
    """The capture's allocations, one entry per ALLOC row, in allocation order. Every per-block
    array of the stages (phase, category, modality) is indexed like these."""

    rows: np.ndarray  # the ALLOC row of each block in the recorder's columns
    ids: np.ndarray  # increasing: the recorder numbers blocks in allocation order
    alloc_ns: np.ndarray
    free_ns: np.ndarray  # NEVER_NS while alive at the end
    ctx: np.ndarray  # int64 module context that made it, -1 = outside any module
    ptr: np.ndarray

    @classmethod
    def of(cls, cols: RecorderColumns) -> Blocks:
        rows = np.flatnonzero(cols.action == NativeRecord.ALLOC)
        free_rows = np.flatnonzero(cols.action == NativeRecord.FREE)
        ids = cols.ids[rows]
        free_ns = np.full(len(rows), NEVER_NS, dtype=np.int64)
        if len(rows) and len(free_rows):
            # ids are sorted, so a FREE finds its block by binary search (and misses blocks
            # allocated before the capture)
            pos = np.clip(np.searchsorted(ids, cols.ids[free_rows]), 0, len(rows) - 1)
            hit = ids[pos] == cols.ids[free_rows]
            free_ns[pos[hit]] = cols.time_ns[free_rows][hit]
        return cls(
            rows=rows,
            ids=ids,
            alloc_ns=cols.time_ns[rows],
            free_ns=free_ns,
            ctx=cols.ctx[rows].astype(np.int64),
            ptr=cols.ptr[rows],
        )

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class Clock:
    """Recorder nanoseconds -> trace microseconds since the capture started (never negative)."""

    t0_ns: int

    def us(self, t_ns: int) -> int:
        return max(0, (int(t_ns) - self.t0_ns) // 1000)

    def us_array(self, t_ns: np.ndarray) -> np.ndarray:
        return np.maximum(0, (t_ns - self.t0_ns) // 1000)
