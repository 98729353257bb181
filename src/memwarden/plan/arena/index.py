"""The overlap index behind the arena planner's greedy placement, and its packed-span helpers.

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

import numpy as np

# Start-order buckets: 32 records, and groups of 32 of those (1024 records).
_SMALL_SHIFT = 5
_GROUP_SHIFT = 5
_BIG_SHIFT = _SMALL_SHIFT + _GROUP_SHIFT
_SMALL = 1 << _SMALL_SHIFT
_SPAN_SHIFT = 48  # packed span = start << 48 | stop; arenas stay below 256 TiB
SPAN_MASK = (1 << _SPAN_SHIFT) - 1


class OverlapIndex:
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
    sh, mask = _SPAN_SHIFT, SPAN_MASK
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
    sh, mask = _SPAN_SHIFT, SPAN_MASK
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
