"""The block each CUDA allocation really got, read off the memory history's own addresses.

``torch.cuda.memory_allocated()`` counts blocks, not requests: a request is rounded up
(``round_size``), and when the free block it is carved from would leave too small a remainder
(``should_split`` is false: under 512 B in the small pool, at most 1 MiB in the large one), the
whole block is handed out. The memory history's ``alloc`` entries carry the requested size only,
so a trace that sums requests reads low wherever that happened (a 19.5 MiB tensor in a fresh
20 MiB segment holds all 20 MiB).

``allocated_block_bytes`` replays the history's segments and blocks *at the addresses the real
allocator chose* — it decides nothing itself, it only asks, at each ``alloc``, which free range
starts at that address and whether the allocator would have split it. Constants and rules from
c10/cuda/CUDACachingAllocator.cpp (``round_size``, ``should_split``, ``free_block``'s merge with
neighbours in the same segment). Where the state before the history is unknown (blocks alive when
recording began), a block keeps its rounded request.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from typing import Any

import numpy as np

from memwarden.trace.model import Action, Trace

__all__ = ["K_MIN_BLOCK_SIZE", "K_SMALL_SIZE", "allocated_block_bytes", "round_block", "roundup_power2_next_division"]

K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: "all sizes are rounded to at least 512 bytes"
K_SMALL_SIZE = 1 << 20  # kSmallSize: "largest 'small' allocation is 1 MiB"
_ROUNDUP_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals, the first starting at 1 MiB (2**20)
_ROUNDUP_START_LOG2 = 20


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: 1200 with 4 divisions -> 1280 (1024, 1280, 1536, 1792)."""
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def round_block(nbytes: int, divisions: int = 0) -> int:
    """``round_size`` for a request of ``nbytes`` with ``divisions`` power-of-two divisions."""
    if nbytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if divisions > 1 and nbytes > K_MIN_BLOCK_SIZE * divisions:
        return roundup_power2_next_division(nbytes, divisions)
    return -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


class _Settings:
    """The parts of the snapshot's ``allocator_settings`` that decide block sizes."""

    def __init__(self, settings: Any) -> None:
        settings = settings if isinstance(settings, dict) else {}
        self.expandable = bool(settings.get("expandable_segments", False))
        mss = settings.get("max_split_size", -1)
        self.max_split = int(mss) if isinstance(mss, int) and mss > 0 else None
        divisions = settings.get("roundup_power2_divisions")
        self.divisions = [0] * _ROUNDUP_INTERVALS
        if isinstance(divisions, dict):  # {"1": d, "2": d, ...}: the interval starting at 2**(20 + i) MiB
            for i, key in enumerate(sorted(divisions, key=lambda k: int(k) if str(k).isdigit() else 1 << 62)):
                value = divisions[key]
                if i < _ROUNDUP_INTERVALS and isinstance(value, int) and value > 0:
                    self.divisions[i] = value
        elif isinstance(divisions, int) and divisions > 0:
            self.divisions = [divisions] * _ROUNDUP_INTERVALS

    def round(self, nbytes: int) -> int:
        index = min(max(nbytes.bit_length() - 1 - _ROUNDUP_START_LOG2, 0), _ROUNDUP_INTERVALS - 1)
        return round_block(nbytes, self.divisions[index])

    def splits(self, size: int, remaining: int) -> bool:
        """``should_split``: is the rest of a free block kept as its own free block?"""
        if size <= K_SMALL_SIZE or self.expandable:
            return remaining >= K_MIN_BLOCK_SIZE
        return (self.max_split is None or size < self.max_split) and remaining > K_SMALL_SIZE


class _Device:
    """Segments and free ranges of one device, at real addresses."""

    def __init__(self) -> None:
        self.seg_starts: list[int] = []
        self.seg_end: dict[int, int] = {}
        self.free_size: dict[int, int] = {}  # start -> size
        self.free_end: dict[int, int] = {}  # end -> start
        self.unknown: set[int] = set()  # segments holding blocks from before the history: not mirrored

    def forget_segment_of(self, addr: int) -> None:
        """A block alive before recording began: its segment's free ranges are unknown from here on."""
        bounds = self.segment_bounds(addr)
        if bounds is not None:
            self.unknown.add(bounds[0])
            for start in [s for s in self.free_size if bounds[0] <= s < bounds[1]]:
                self.take_free(start)

    def segment_bounds(self, addr: int) -> tuple[int, int] | None:
        i = bisect_right(self.seg_starts, addr) - 1
        if i < 0:
            return None
        start = self.seg_starts[i]
        end = self.seg_end[start]
        return (start, end) if addr < end else None

    def add_segment(self, addr: int, size: int) -> None:
        if addr not in self.seg_end:
            insort(self.seg_starts, addr)
        self.seg_end[addr] = addr + size
        self.add_free(addr, size)

    def drop_segment(self, addr: int) -> None:
        end = self.seg_end.pop(addr, None)
        if end is None:
            return
        self.unknown.discard(addr)
        del self.seg_starts[bisect_right(self.seg_starts, addr) - 1]
        size = self.free_size.pop(addr, None)
        if size is not None:
            self.free_end.pop(addr + size, None)

    def add_free(self, addr: int, size: int) -> None:
        self.free_size[addr] = size
        self.free_end[addr + size] = addr

    def take_free(self, addr: int) -> int | None:
        size = self.free_size.pop(addr, None)
        if size is not None:
            del self.free_end[addr + size]
        return size

    def release(self, addr: int, size: int) -> None:
        """``free_block``: merge with free neighbours in the same segment."""
        bounds = self.segment_bounds(addr)
        if bounds is None or bounds[0] in self.unknown:
            return
        end = addr + size
        if end < bounds[1]:
            after = self.take_free(end)
            if after is not None:
                size += after
        if addr > bounds[0] and addr in self.free_end:
            before = self.free_end[addr]
            size += self.take_free(before) or 0
            addr = before
        self.add_free(addr, size)


def allocated_block_bytes(trace: Trace) -> np.ndarray:
    """``trace``'s nbytes column with every ALLOC/PREEXISTING/FREE row of a CUDA device set to the
    block the caching allocator handed out (what ``memory_allocated()`` counted); other rows as they
    are. ``trace`` is a converted memory history (``snapshot_to_trace``) in its own row order, its
    ``metadata["allocator_settings"]`` the snapshot's."""
    settings = _Settings(trace.metadata.get("allocator_settings"))
    e = trace.events
    out = e["nbytes"].astype(np.int64, copy=True)
    cuda = np.asarray([name.startswith("cuda") for name in trace.devices] or [False], dtype=bool)
    wanted = (Action.ALLOC, Action.PREEXISTING, Action.FREE, Action.SEGMENT_ALLOC, Action.SEGMENT_FREE)
    rows = np.flatnonzero(np.isin(e["action"], np.asarray(wanted, np.uint8)) & cuda[e["device"]])
    devices: dict[int, _Device] = {}
    live: dict[int, tuple[int, int, int]] = {}  # tensor -> (device, address, block bytes)
    actions, tensors, addrs = e["action"][rows].tolist(), e["tensor"][rows].tolist(), e["address"][rows].tolist()
    sizes, devs = e["nbytes"][rows].tolist(), e["device"][rows].tolist()
    for j, row in enumerate(rows.tolist()):
        action, addr, dev = actions[j], addrs[j], devs[j]
        state = devices.setdefault(dev, _Device())
        if action == Action.SEGMENT_ALLOC:
            state.add_segment(addr, sizes[j])
        elif action == Action.SEGMENT_FREE:
            state.drop_segment(addr)
        elif action == Action.FREE:
            block = live.pop(tensors[j], None)
            if block is not None:
                out[row] = block[2]
                devices[block[0]].release(block[1], block[2])
        else:
            size = settings.round(sizes[j]) if sizes[j] > 0 else 0
            if action == Action.PREEXISTING:
                state.forget_segment_of(addr)
            whole = state.take_free(addr) if action == Action.ALLOC and size else None
            if whole is not None and whole >= size:
                remaining = whole - size
                if remaining and settings.splits(size, remaining):
                    state.add_free(addr + size, remaining)
                else:
                    size = whole
            elif whole is not None:  # the history and the mirror disagree: keep the range, trust the request
                state.add_free(addr, whole)
            out[row] = size
            live[tensors[j]] = (dev, addr, size)
    return out
