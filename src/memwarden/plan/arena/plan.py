"""Arena plans: lifetimes of a trace's tensors and the greedy offset strategies over them.

The overview (strategies, sources, speed) is in the docstring of ``memwarden.plan.arena``; the
overlap index that places records is in ``memwarden.plan.arena.index``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from memwarden.plan.allocator.config import SizeLimitError
from memwarden.plan.arena.index import SPAN_MASK, OverlapIndex
from memwarden.trace.model import Action, Trace

STRATEGIES = ("greedy-by-size", "greedy-by-breadth", "best")
DEFAULT_ALIGNMENT = 64  # bytes; TFLite aligns arena tensors to 64 (kDefaultTensorAlignment)


@dataclass(frozen=True, kw_only=True, eq=False)
class Lifetimes:
    """One record per allocated block of one device: inclusive row interval and bytes."""

    tensor: np.ndarray  # (n,) trace tensor id
    first: np.ndarray  # (n,) row of the ALLOC (0 for PREEXISTING)
    last: np.ndarray  # (n,) row of the FREE, or num_events - 1 if never freed
    nbytes: np.ndarray  # (n,) requested bytes
    freed: np.ndarray  # (n,) bool: a FREE row ends it
    num_events: int

    def __len__(self) -> int:
        return len(self.tensor)


def lifetimes(trace: Trace, device: int = 0) -> Lifetimes:
    """Pair each ALLOC/PREEXISTING row of ``device`` with its FREE (same tensor id).

    MAP/UNMAP (file-backed) rows are ignored; a FREE without an ALLOC is ignored;
    an id allocated again while live starts a new record (the old one never ends).
    """
    ev = trace.events
    action = ev["action"]
    is_alloc = (action == Action.ALLOC) | (action == Action.PREEXISTING)
    mask = (ev["device"] == device) & (is_alloc | (action == Action.FREE))
    rows = np.flatnonzero(mask)
    allocs = is_alloc[rows].tolist()
    tensors = ev["tensor"][rows].tolist()
    n_alloc = int(np.count_nonzero(is_alloc[rows]))
    last = np.full(n_alloc, trace.num_events - 1, dtype=np.int64)
    freed = np.zeros(n_alloc, dtype=bool)
    open_records: dict[int, int] = {}
    record_rows = []
    k = 0
    for row, is_a, t in zip(rows.tolist(), allocs, tensors, strict=True):
        if is_a:
            open_records[t] = k
            record_rows.append(row)
            k += 1
        else:
            r = open_records.pop(t, -1)
            if r >= 0:
                last[r] = row
                freed[r] = True
    rec_rows = np.asarray(record_rows, dtype=np.int64)
    first = np.where(action[rec_rows] == Action.PREEXISTING, 0, rec_rows)
    return Lifetimes(
        tensor=ev["tensor"][rec_rows].astype(np.int64),
        first=first.astype(np.int64),
        last=last,
        nbytes=ev["nbytes"][rec_rows].astype(np.int64),
        freed=freed,
        num_events=trace.num_events,
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class ArenaPlan:
    """Offsets of every record in one arena. ``bytes`` of a tensor is its size rounded up to ``alignment``."""

    strategy: str
    alignment: int
    arena_bytes: int
    lower_bound_bytes: int  # max over rows of live (aligned) bytes: no plan can do better
    naive_bytes: int  # sum of all (aligned) sizes: no sharing at all
    tensor_ids: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    first: np.ndarray
    last: np.ndarray

    @property
    def tensors(self) -> list[dict[str, int]]:
        return [
            {"id": int(t), "offset": int(o), "bytes": int(s), "first": int(f), "last": int(la)}
            for t, o, s, f, la in zip(
                self.tensor_ids.tolist(),
                self.offsets.tolist(),
                self.sizes.tolist(),
                self.first.tolist(),
                self.last.tolist(),
                strict=True,
            )
        ]

    def to_json(self, *, include_tensors: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "strategy": self.strategy,
            "alignment": self.alignment,
            "arena_bytes": int(self.arena_bytes),
            "lower_bound_bytes": int(self.lower_bound_bytes),
            "naive_bytes": int(self.naive_bytes),
            "num_tensors": len(self.tensor_ids),
        }
        if include_tensors:
            out["tensors"] = self.tensors
        return out

    def overlapping_pairs(self) -> list[tuple[int, int]]:
        """Pairs of record indices that are live together and share bytes (empty for a valid plan)."""
        order = np.lexsort((self.last, self.first)).tolist()
        first, last = self.first.tolist(), self.last.tolist()
        off, size = self.offsets.tolist(), self.sizes.tolist()
        active: list[int] = []  # records live at the sweep time
        bad = []
        for r in order:
            active = [q for q in active if last[q] >= first[r]]
            for q in active:
                if size[r] and size[q] and off[q] < off[r] + size[r] and off[r] < off[q] + size[q]:
                    bad.append((q, r))
            active.append(r)
        return bad


def plan_arena(
    source: Trace | Lifetimes,
    strategy: str = "best",
    alignment: int = DEFAULT_ALIGNMENT,
    device: int = 0,
) -> ArenaPlan:
    """Plan a static arena for the ALLOC/PREEXISTING/FREE rows of ``device``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown arena strategy {strategy!r} (valid: {', '.join(STRATEGIES)})")
    if alignment <= 0:
        raise ValueError("alignment must be positive")
    life = source if isinstance(source, Lifetimes) else lifetimes(source, device)
    sizes = -(-life.nbytes // alignment) * alignment  # (n,) aligned bytes
    lower = _max_live(life.first, life.last, sizes, life.num_events)
    naive = int(sizes.sum())
    if naive > SPAN_MASK:
        raise SizeLimitError(
            f"device {device}'s tensors add up to {naive} bytes, more than 256 TiB; the planner packs offsets in 48 bits"
        )
    index = OverlapIndex(life.first, life.last)
    # Breadth first: it packs the busiest moment's tensors side by side from offset 0, so it
    # reaches the lower bound more often, and reaching it makes the second run unnecessary.
    candidates = ("greedy-by-breadth", "greedy-by-size") if strategy == "best" else (strategy,)
    best_offsets, best_arena, best_name = np.zeros(0, np.int64), -1, candidates[0]
    for name in candidates:
        order = _size_order(life, sizes) if name == "greedy-by-size" else _breadth_order(life, sizes, index)
        offsets = index.place(order, sizes)
        arena = int((offsets + sizes).max()) if len(sizes) else 0
        if best_arena < 0 or arena < best_arena:
            best_offsets, best_arena, best_name = offsets, arena, name
        if best_arena <= lower:
            break  # optimal: no other strategy can beat the lower bound
    return ArenaPlan(
        strategy=best_name,
        alignment=alignment,
        arena_bytes=max(best_arena, 0),
        lower_bound_bytes=lower,
        naive_bytes=naive,
        tensor_ids=life.tensor,
        offsets=best_offsets,
        sizes=sizes,
        first=life.first,
        last=life.last,
    )


def _max_live(first: np.ndarray, last: np.ndarray, sizes: np.ndarray, num_events: int) -> int:
    if len(sizes) == 0:
        return 0
    delta = np.zeros(num_events + 1, dtype=np.int64)
    np.add.at(delta, first, sizes)
    np.add.at(delta, last + 1, -sizes)
    return int(np.cumsum(delta).max())


def _size_order(life: Lifetimes, sizes: np.ndarray) -> list[int]:
    """Non-increasing size; ties by first use, then record order (TFLite leaves ties unspecified)."""
    return np.lexsort((np.arange(len(sizes)), life.first, -sizes)).tolist()


def _breadth_order(life: Lifetimes, sizes: np.ndarray, index: OverlapIndex) -> list[int]:
    """Tasks by non-increasing breadth, tensors of a task by non-increasing size, each tensor once.

    A tensor is placed with the first task (in that order) it is live at, so its
    key is the minimum task rank over its lifetime: a range-minimum query, done
    for all tensors at once with a sparse table. Breadth only rises at a start,
    so the tasks worth ranking are the distinct start times.
    """
    n = len(sizes)
    if n == 0:
        return []
    times = index.times  # (T,) distinct start times, sorted
    # breadth at each start time = live bytes there
    lo, hi = index.lo_rank, index.hi_rank
    delta = np.zeros(len(times) + 1, dtype=np.int64)
    np.add.at(delta, lo, sizes)
    np.add.at(delta, hi + 1, -sizes)
    breadth = np.cumsum(delta)[:-1]
    task_rank = np.empty(len(times), dtype=np.int64)
    task_rank[np.lexsort((np.arange(len(times)), -breadth))] = np.arange(len(times))
    key = _range_min(task_rank, lo, hi)
    return np.lexsort((np.arange(n), -sizes, key)).tolist()


def _range_min(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """min(values[lo[i]:hi[i] + 1]) for every i, via a sparse table (O(T log T) memory)."""
    table = [values]
    span = 1
    while span * 2 <= len(values):
        prev = table[-1]
        table.append(np.minimum(prev[: len(prev) - span], prev[span:]))
        span *= 2
    length = hi - lo + 1
    level = np.floor(np.log2(length)).astype(np.int64)
    out = np.empty(len(lo), dtype=values.dtype)
    for k in np.unique(level).tolist():
        sel = level == k
        row = table[k]
        out[sel] = np.minimum(row[lo[sel]], row[hi[sel] - (1 << k) + 1])
    return out
