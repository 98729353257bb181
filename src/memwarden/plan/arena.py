"""Static arena planning: give every tensor of a trace a fixed offset in one buffer.

If the whole allocation sequence is known in advance (an exported graph, a
fixed-shape inference step), tensors whose lifetimes never overlap can share
memory, and one arena replaces the caching allocator. The strategies are the
offset-calculation heuristics of Pisarchyk & Lee, "Efficient Memory Management
for Deep Neural Net Inference" (arXiv 2001.03288), as implemented in TFLite's
GPU delegate (``tensorflow/lite/delegates/gpu/common/memory_management/``):

- ``greedy-by-size``: records by non-increasing size; each goes into the
  smallest gap between placed records whose lifetimes intersect its own, else
  right after the highest of them.
- ``greedy-by-breadth``: time steps by non-increasing breadth (live bytes); the
  tensors of each step by non-increasing size; the same placement rule.
- ``best``: runs both and keeps the smaller arena, skipping the second when the first
  already reaches the lower bound (ExecuTorch's planner suite keeps the best of several too).

Lifetimes are inclusive trace-row intervals ``[first, last]``: PREEXISTING
counts from row 0, a tensor never freed lives to the last row.

Speed: the placement needs, per record, the placed records whose lifetimes
intersect it. A record that intersects ``[a, b]`` either is live at ``a`` (a
stabbing query: a segment tree over start times, each record stored at the
O(log n) nodes that cover its lifetime) or starts inside ``[a, b]`` (a range of
the start-sorted order). Records that span the whole trace (weights) are kept
as one coalesced union instead, so they cost nothing per query. The work is
O(n log n + overlapping pairs), not O(n^2) unless everything overlaps everything.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any

import numpy as np

from memwarden.trace.model import Action, Trace

__all__ = ["STRATEGIES", "ArenaPlan", "Lifetimes", "lifetimes", "plan_arena", "replay_arena"]

STRATEGIES = ("greedy-by-size", "greedy-by-breadth", "best")
# Start-order buckets: 32 records, and groups of 32 of those (1024 records).
_SMALL_SHIFT = 5
_GROUP_SHIFT = 5
_BIG_SHIFT = _SMALL_SHIFT + _GROUP_SHIFT
_SMALL = 1 << _SMALL_SHIFT
_SPAN_SHIFT = 48  # packed span = start << 48 | stop; arenas stay below 256 TiB
_SPAN_MASK = (1 << _SPAN_SHIFT) - 1
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
    if naive > _SPAN_MASK:
        raise ValueError("tensors add up to more than 256 TiB; the planner packs offsets in 48 bits")
    index = _OverlapIndex(life.first, life.last)
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


def _breadth_order(life: Lifetimes, sizes: np.ndarray, index: _OverlapIndex) -> list[int]:
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


class _OverlapIndex:
    """Answers "which offsets are taken by placed records whose lifetimes meet this one?".

    A lifetime ``[a, b]`` meets ``[s, e]`` iff it contains ``a`` or starts inside
    ``[a, b]``. Time is compressed to the distinct start times (which keeps every
    overlap). For "contains a" a segment tree over start ranks holds each record
    at the O(log n) nodes that cover its lifetime, and every node keeps the
    coalesced union of the offset spans of its *placed* records: a query walks
    one leaf-to-root path. For "starts inside" the start-sorted order is cut into
    buckets of 32 and 1024 records, each with the union of its placed spans: a
    query reads at most 2 x 32 records one by one and the unions of the buckets
    in between. Unions stay short because records live at the same time are
    packed side by side, so a query costs O(log n + spans), however many records
    overlap. Records that span the whole trace (weights) meet everything and are
    kept in one union.
    """

    def __init__(self, first: np.ndarray, last: np.ndarray):
        n = len(first)
        self.n = n
        self.first, self.last = first, last
        t0 = int(first.min()) if n else 0
        t1 = int(last.max()) if n else 0
        self.full = (first <= t0) & (last >= t1)  # live for the whole trace: overlaps everything
        part = np.flatnonzero(~self.full)
        self.times = np.unique(first[part]) if len(part) else np.zeros(1, np.int64)
        self.lo_rank = np.minimum(np.searchsorted(self.times, first), len(self.times) - 1)
        self.hi_rank = np.searchsorted(self.times, last, side="right") - 1
        by_start = part[np.argsort(first[part], kind="stable")]
        self.start_times = first[by_start].tolist()
        self.start_pos = np.zeros(n, dtype=np.int64)  # record -> position in start order
        self.start_pos[by_start] = np.arange(len(by_start))
        self.start_ids = by_start.tolist()
        self._build_tree(part)

    def _build_tree(self, part: np.ndarray) -> None:
        """Canonical segment-tree nodes of every partial record, vectorised over records."""
        leaves = 1 << max(1, (len(self.times) - 1).bit_length())
        left = self.lo_rank[part] + leaves
        right = self.hi_rank[part] + leaves + 1
        rec = part
        nodes, recs = [], []
        while len(rec):
            take_left = (left & 1) == 1
            nodes.append(left[take_left])
            recs.append(rec[take_left])
            left = left + take_left
            take_right = ((right & 1) == 1) & (left < right)
            right = right - take_right
            nodes.append(right[take_right])
            recs.append(rec[take_right])
            left, right = left >> 1, right >> 1
            keep = left < right
            left, right, rec = left[keep], right[keep], rec[keep]
        node_arr = np.concatenate(nodes) if nodes else np.zeros(0, np.int64)
        rec_arr = np.concatenate(recs) if recs else np.zeros(0, np.int64)
        order = np.argsort(rec_arr, kind="stable")
        self.leaves = leaves
        self.rec_ptr = np.searchsorted(rec_arr[order], np.arange(self.n + 1)).tolist()
        self.rec_nodes = node_arr[order].tolist()

    def place(self, order: list[int], sizes: np.ndarray) -> np.ndarray:
        """Offsets for records placed in ``order`` (greedy: smallest fitting gap, else on top)."""
        n = self.n
        size = sizes.tolist()
        off = [-1] * n
        full = self.full.tolist()
        lo_rank = self.lo_rank.tolist()
        first, last = self.first.tolist(), self.last.tolist()
        start_times, start_ids = self.start_times, self.start_ids
        start_pos = self.start_pos.tolist()
        rec_ptr, rec_nodes, leaves = self.rec_ptr, self.rec_nodes, self.leaves
        sh = _SPAN_SHIFT
        # A span [start, stop) is one int, start << _SPAN_SHIFT | stop: sorting and bisecting
        # ints is several times faster than tuples, and int order is start order.
        node_union: list[list[int] | None] = [None] * (2 * leaves)
        full_union: list[int] = []  # placed whole-trace records
        n_part = len(start_ids)
        small_buckets: list[list[int] | None] = [None] * ((n_part >> _SMALL_SHIFT) + 1)
        big_buckets: list[list[int] | None] = [None] * ((n_part >> _BIG_SHIFT) + 1)
        for r in order:
            need = size[r]
            if not need:
                off[r] = 0
                continue
            spans = full_union[:]
            if full[r]:  # meets everything: the whole-trace union plus every start bucket
                _starting_spans(spans, 0, n_part, start_ids, off, size, small_buckets, big_buckets)
            else:
                node = lo_rank[r] + leaves
                while node:
                    u = node_union[node]
                    if u:
                        spans += u
                    node >>= 1
                s0, s1 = bisect_left(start_times, first[r]), bisect_right(start_times, last[r])
                if s1 - s0 <= _SMALL:
                    for c in start_ids[s0:s1]:
                        o = off[c]
                        if o >= 0:
                            spans.append(o << sh | (o + size[c]))
                else:
                    _starting_spans(spans, s0, s1, start_ids, off, size, small_buckets, big_buckets)
            spans.sort()
            offset = _best_gap(spans, need)
            off[r] = offset
            stop = offset + need
            if full[r]:
                _add_span(full_union, offset, stop)
                continue
            for node in rec_nodes[rec_ptr[r] : rec_ptr[r + 1]]:
                u = node_union[node]
                if u is None:
                    node_union[node] = [offset << sh | stop]
                else:
                    _add_span(u, offset, stop)
            pos = start_pos[r]
            for buckets, key in ((small_buckets, pos >> _SMALL_SHIFT), (big_buckets, pos >> _BIG_SHIFT)):
                u = buckets[key]
                if u is None:
                    buckets[key] = [offset << sh | stop]
                else:
                    _add_span(u, offset, stop)
        return np.asarray(off, dtype=np.int64)


def _starting_spans(
    spans: list[int],
    s0: int,
    s1: int,
    start_ids: list[int],
    off: list[int],
    size: list[int],
    small_buckets: list[list[int] | None],
    big_buckets: list[list[int] | None],
) -> None:
    """Spans of placed records at start positions [s0, s1): whole buckets as unions, ragged ends one by one."""
    sh = _SPAN_SHIFT
    a1, b1 = -(-s0 >> _SMALL_SHIFT), s1 >> _SMALL_SHIFT  # small buckets fully inside
    if a1 >= b1:
        a1 = b1 = s1 >> _SMALL_SHIFT
        singles = [(s0, s1)]
    else:
        singles = [(s0, a1 << _SMALL_SHIFT), (b1 << _SMALL_SHIFT, s1)]
    for lo, hi in singles:
        for c in start_ids[lo:hi]:
            o = off[c]
            if o >= 0:
                spans.append(o << sh | (o + size[c]))
    a2, b2 = -(-a1 >> _GROUP_SHIFT), b1 >> _GROUP_SHIFT  # big buckets fully inside
    if a2 < b2:
        small_ranges = [(a1, a2 << _GROUP_SHIFT), (b2 << _GROUP_SHIFT, b1)]
        for u in big_buckets[a2:b2]:
            if u:
                spans += u
    else:
        small_ranges = [(a1, b1)]
    for lo, hi in small_ranges:
        for u in small_buckets[lo:hi]:
            if u:
                spans += u


def _pack(start: int, stop: int) -> int:
    return start << _SPAN_SHIFT | stop


def _best_gap(spans: list[int], need: int) -> int:
    """TFLite's offset rule over packed spans sorted by start: the smallest gap that fits, else the top."""
    sh, mask = _SPAN_SHIFT, _SPAN_MASK
    best_offset, best_gap = -1, 1 << 62
    prev_end = 0
    for span in spans:
        start = span >> sh
        if start > prev_end:
            gap = start - prev_end
            if need <= gap < best_gap:
                if gap == need:
                    return prev_end  # a perfect fit: no later gap can be smaller
                best_gap, best_offset = gap, prev_end
        stop = span & mask
        if stop > prev_end:
            prev_end = stop
    return prev_end if best_offset < 0 else best_offset


def _add_span(union: list[int], start: int, stop: int) -> None:
    """Insert [start, stop) into a sorted list of disjoint packed spans, merging touching ones."""
    sh, mask = _SPAN_SHIFT, _SPAN_MASK
    i = bisect_left(union, start << sh)
    if i:
        prev = union[i - 1]
        prev_stop = prev & mask
        if prev_stop >= start:
            if prev_stop >= stop:
                return
            i -= 1
            start = prev >> sh
    j = i
    n = len(union)
    while j < n:
        span = union[j]
        if span >> sh > stop:
            break
        if span & mask > stop:
            stop = span & mask
        j += 1
    if j == i:
        union.insert(i, start << sh | stop)
    else:
        union[i:j] = [start << sh | stop]


# -- replay through an arena ------------------------------------------------------------


def replay_arena(
    trace: Trace,
    config: Any = None,
    device: int = 0,
    *,
    strategy: str = "best",
    alignment: int = DEFAULT_ALIGNMENT,
    history_columns: int = 0,
) -> Any:
    """``replay(..., allocator="arena")``: every tensor at its planned offset, the arena reserved up front.

    Reserved is ``arena_bytes`` from the first allocation on; allocated is the live
    (aligned) tensor bytes. The "peak" moment is the row where allocated is highest.
    With ``config.limit_bytes`` below the arena size the first allocation fails.
    """
    from memwarden.plan.allocator import AllocatorConfig, LayoutHistory, ReplayResult

    config = config or AllocatorConfig()
    life = lifetimes(trace, device)
    plan = plan_arena(life, strategy, alignment)
    n_events = trace.num_events
    arena = plan.arena_bytes
    end_row = np.where(life.freed, life.last, n_events)  # first row at which the tensor is gone
    delta = np.zeros(n_events + 1, dtype=np.int64)
    np.add.at(delta, life.first, plan.sizes)
    np.add.at(delta, end_row, -plan.sizes)
    allocated = np.cumsum(delta)[:n_events]
    started = len(life) > 0
    first_row = int(life.first.min()) if started else n_events
    reserved = np.where(np.arange(n_events) >= first_row, arena, 0).astype(np.int64)
    oom = None
    if started and config.limit_bytes is not None and arena > config.limit_bytes:
        oom = first_row
        allocated, reserved = allocated[: oom + 1] * 0, reserved[: oom + 1] * 0
    base = 1 << 40

    def live_at(row: int) -> np.ndarray:
        return np.flatnonzero((life.first <= row) & (end_row > row) & (plan.sizes > 0))

    def snapshot(row: int) -> list[dict[str, Any]]:
        if oom is not None or not started or arena == 0:
            return []
        live = live_at(row)
        live = live[np.argsort(plan.offsets[live], kind="stable")]
        blocks, cursor, used, requested = [], 0, 0, 0
        for i in live.tolist():
            offset, size, req = int(plan.offsets[i]), int(plan.sizes[i]), int(life.nbytes[i])
            if offset > cursor:
                blocks.append(_block(base + cursor, offset - cursor, 0, "inactive"))
            blocks.append(_block(base + offset, size, req, "active_allocated"))
            cursor, used, requested = offset + size, used + size, requested + req
        if cursor < arena:
            blocks.append(_block(base + cursor, arena - cursor, 0, "inactive"))
        return [
            {
                "device": device,
                "address": base,
                "total_size": arena,
                "allocated_size": used,
                "active_size": used,
                "requested_size": requested,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        ]

    peak_row = int(np.argmax(allocated)) if started and oom is None and n_events else -1
    peak_segments = snapshot(peak_row) if peak_row >= 0 else []
    peak_alloc = int(allocated[peak_row]) if peak_row >= 0 else 0
    gaps = [b["size"] for s in peak_segments for b in s["blocks"] if b["state"] == "inactive"]
    history = None
    if history_columns > 0 and started and oom is None and arena:
        cols = sorted({int(x) for x in np.linspace(first_row, n_events - 1, min(history_columns, n_events)).round()})
        seg = np.asarray([[base, arena]], dtype=np.int64)
        blocks_cols = []
        for row in cols:
            live = live_at(row)
            blocks_cols.append(np.stack([base + plan.offsets[live], plan.sizes[live], np.ones(len(live), np.int64)], 1))
        history = LayoutHistory(
            event_index=np.asarray(cols, dtype=np.int64),
            segments=[seg] * len(cols),
            blocks=blocks_cols,
            allocator="arena",
        )
    reserved_peak = arena if started and oom is None else 0
    return ReplayResult(
        allocator="arena",
        config=config,
        peak_allocated_bytes=int(allocated.max()) if len(allocated) else 0,
        peak_reserved_bytes=reserved_peak,
        fragmentation=(1.0 - peak_alloc / arena) if reserved_peak else 0.0,
        reserved_unallocated_at_peak_bytes=(arena - peak_alloc) if reserved_peak else 0,
        largest_free_block_at_peak_bytes=max(gaps, default=0),
        segments_at_peak=len(peak_segments),
        num_alloc_retries=0,
        oom_at_event=oom,
        peak_event=peak_row,
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        segments_at_peak_snapshot=peak_segments,
        segments_at_end_snapshot=snapshot(n_events - 1) if n_events else [],
        history=history,
    )


def _block(address: int, size: int, requested: int, state: str) -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": requested, "state": state, "frames": []}
