"""A pure-Python model of PyTorch's CUDA caching allocator, and trace replay through it.

``replay(trace)`` answers "what would ``torch.cuda.memory_reserved()`` have been?"
for a recorded allocation sequence: the allocator rounds requests, carves them
out of cached segments, and keeps freed blocks cached, so reserved memory runs
ahead of live tensor bytes. The difference at the reserved peak is the
fragmentation that the ``fragmentation`` pattern reports.

The rules follow ``c10/cuda/CUDACachingAllocator.cpp`` (DeviceCachingAllocator:
``malloc``, ``get_free_block``, ``should_split``, ``alloc_block``,
``release_available_cached_blocks``, ``release_cached_blocks``, ``free_block``,
``try_merge_blocks`` and the expandable-segment functions) and
``c10/core/AllocatorConfig.cpp`` (``PYTORCH_CUDA_ALLOC_CONF`` parsing). One
stream, no CUDA graphs, no cross-stream events. Constants cite their source.

Speed: a replay is one dict/bisect pass, no objects per event. A pool keeps
its free blocks as a sorted list of the distinct sizes plus, per size, the
sorted addresses: ``bisect_left(sizes, size)`` then the first address is
exactly the allocator's ``lower_bound`` on (size, address), best fit with the
lowest address among equals, and an exact-size hit costs one dict lookup. The
lists stay short (tens of sizes), so ``insort`` is a short memmove: faster
than a SortedList, and no extra dependency. Neighbours are found through
``_free_size`` (start -> size) and ``_free_end`` (end -> start); segments are
placed with gaps between them, so blocks that touch in address space always
belong to the same segment.

``limit_bytes`` plays both parts a real limit can: the
``set_per_process_memory_fraction`` check before every cudaMalloc/mapping
(``reserved + segment size > limit`` fails) and the device running out of
physical pages when an expandable segment grows.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memwarden.trace.model import Action, Trace

__all__ = [
    "AllocatorConfig",
    "CachingAllocatorModel",
    "LayoutHistory",
    "ReplayResult",
    "SimulatedOOM",
    "parse_alloc_conf",
    "replay",
]

# -- constants (c10/cuda/CUDACachingAllocator.cpp unless noted) ---------------------
K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: "all sizes are rounded to at least 512 bytes"
K_SMALL_SIZE = 1 << 20  # kSmallSize: "largest 'small' allocation is 1 MiB"
K_SMALL_BUFFER = 2 << 20  # kSmallBuffer: "'small' allocations are packed in 2 MiB blocks"
K_LARGE_BUFFER = 20 << 20  # kLargeBuffer: "'large' allocations may be packed in 20 MiB blocks"
K_MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: "allocations between 1 and 10 MiB may use kLargeBuffer"
K_ROUND_LARGE = 2 << 20  # kRoundLarge: "round up large allocations to 2 MiB"
# ExpandableSegment page sizes: "we use 2MiB pages for our small pool and 20MiB pages
# for our large pool" (Note [Expandable Segments]).
K_SMALL_PAGE = K_SMALL_BUFFER
K_LARGE_PAGE = K_LARGE_BUFFER
# c10/core/AllocatorConfig.cpp: kRoundUpPowerOfTwoIntervals = 16 intervals, the first
# starting at kRoundUpPowerOfTwoStart = 1 MiB (one per power of two, up to 64 GiB).
K_ROUNDUP_INTERVALS = 16
K_ROUNDUP_START_LOG2 = 20
_MB = 1 << 20

# Model-only layout: segments get addresses from a bump pointer with a gap after each,
# so two segments never touch and blocks of different segments can never merge.
_BASE_ADDRESS = 1 << 40
_SEGMENT_GAP = 2 << 20
_REQ_BITS = 48  # allocated-block value = block size << _REQ_BITS | requested bytes
_REQ_MASK = (1 << _REQ_BITS) - 1
# Expandable segments reserve 1 1/8 of device memory as address space
# (find_expandable_block); with no device limit we assume this much device memory.
_DEFAULT_DEVICE_BYTES = 1 << 40


class SimulatedOOM(Exception):
    """The model ran out of memory: every retry of PyTorch's malloc failed."""

    def __init__(self, requested_bytes: int, allocated_bytes: int, reserved_bytes: int, limit_bytes: int | None):
        self.requested_bytes = requested_bytes
        self.allocated_bytes = allocated_bytes
        self.reserved_bytes = reserved_bytes
        self.limit_bytes = limit_bytes
        super().__init__(
            f"simulated CUDA out of memory: tried to allocate {requested_bytes} B with {allocated_bytes} B allocated, "
            f"{reserved_bytes} B reserved, limit {limit_bytes} B"
        )


# -- configuration -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AllocatorConfig:
    """The allocator settings that change its behaviour (``PYTORCH_CUDA_ALLOC_CONF``), plus a device limit.

    ``roundup_power2_divisions`` is one value for all sizes or 16 values, one per
    power-of-two interval starting at 1 MiB (PyTorch's list syntax). ``limit_bytes``
    is the memory the allocator may reserve (device capacity, or the
    ``set_per_process_memory_fraction`` cap); ``None`` means unlimited.
    """

    max_split_size_bytes: int | None = None
    max_non_split_rounding_bytes: int = K_LARGE_BUFFER  # AllocatorConfig default: kLargeBuffer
    roundup_power2_divisions: int | tuple[int, ...] = 0
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0
    limit_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_split_size_bytes is not None and self.max_split_size_bytes <= 0:
            raise ValueError("max_split_size_bytes must be positive")
        if self.max_non_split_rounding_bytes <= 0:
            raise ValueError("max_non_split_rounding_bytes must be positive")
        divisions = self.roundup_power2_divisions
        values = (divisions,) if isinstance(divisions, int) else tuple(divisions)
        if not isinstance(divisions, int):
            if len(values) != K_ROUNDUP_INTERVALS:
                raise ValueError(f"roundup_power2_divisions list must have {K_ROUNDUP_INTERVALS} entries")
            object.__setattr__(self, "roundup_power2_divisions", values)
        for value in values:
            if value < 0 or (value and value & (value - 1)):
                raise ValueError("roundup_power2_divisions must be 0 or a power of 2")
        if not 0.0 <= self.garbage_collection_threshold < 1.0:
            raise ValueError("garbage_collection_threshold must be in [0.0, 1.0)")
        if self.limit_bytes is not None and self.limit_bytes < 0:
            raise ValueError("limit_bytes must be >= 0")

    def divisions_for(self, size_bytes: int) -> int:
        """``AllocatorConfig::roundup_power2_divisions(size)``: the interval of floor(log2(size))."""
        divisions = self.roundup_power2_divisions
        if isinstance(divisions, int):
            return divisions
        index = min(max(size_bytes.bit_length() - 1 - K_ROUNDUP_START_LOG2, 0), K_ROUNDUP_INTERVALS - 1)
        return divisions[index]

    def round_size(self, nbytes: int) -> int:
        """``DeviceCachingAllocator::round_size``: the block size a request of ``nbytes`` asks for."""
        if nbytes < K_MIN_BLOCK_SIZE:
            return K_MIN_BLOCK_SIZE
        divisions = self.divisions_for(nbytes)
        if divisions > 1 and nbytes > K_MIN_BLOCK_SIZE * divisions:
            return _roundup_power2_next_division(nbytes, divisions)
        return -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE

    def to_alloc_conf(self) -> str:
        """The ``PYTORCH_CUDA_ALLOC_CONF`` string for these settings (limit not included)."""
        parts = []
        if self.max_split_size_bytes is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size_bytes // _MB}")
        if self.max_non_split_rounding_bytes != K_LARGE_BUFFER:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_bytes // _MB}")
        divisions = self.roundup_power2_divisions
        if isinstance(divisions, int):
            if divisions:
                parts.append(f"roundup_power2_divisions:{divisions}")
        else:
            items = ",".join(f"{1 << i}:{d}" for i, d in enumerate(divisions))
            parts.append(f"roundup_power2_divisions:[{items}]")
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold}")
        return ",".join(parts)


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: 1200 with 4 divisions -> 1280 (1024, 1280, 1536, 1792)."""
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


_IGNORED_KEYS = {
    # Accepted by PyTorch, no effect on where device blocks go.
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
}
_KNOWN_KEYS = [
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "expandable_segments",
    "garbage_collection_threshold",
    "backend",
    *sorted(_IGNORED_KEYS),
]


def parse_alloc_conf(text: str, *, limit_bytes: int | None = None) -> AllocatorConfig:
    """Parse ``PYTORCH_CUDA_ALLOC_CONF`` syntax, e.g. ``"max_split_size_mb:128,expandable_segments:True"``.

    Follows ``AllocatorConfig::parseArgs``: the same keys, the same value checks
    (max_split_size_mb >= 20, divisions powers of two, gc threshold in (0, 1)),
    and the list form ``roundup_power2_divisions:[256:1,512:2,>:4]`` (keys in MiB;
    the first entry also covers every smaller interval, ``>`` every larger one).
    Raises ``ValueError`` with the offending part named.
    """
    source = text.strip()
    for prefix in ("PYTORCH_CUDA_ALLOC_CONF=", "PYTORCH_ALLOC_CONF="):
        if source.startswith(prefix):
            source = source[len(prefix) :]
    tokens = _lex_alloc_conf(source)
    values: dict[str, Any] = {"limit_bytes": limit_bytes}
    i = 0

    def fail(message: str) -> ValueError:
        return ValueError(f"bad allocator config {text!r}: {message}")

    def value_after(key: str) -> str:
        nonlocal i
        if i + 2 >= len(tokens) or tokens[i + 1] != ":" or tokens[i + 2] in ",:[]":
            raise fail(f"expected '{key}:VALUE'")
        i += 2
        return tokens[i]

    def as_int(key: str, raw: str) -> int:
        try:
            return int(raw)
        except ValueError:
            raise fail(f"{key} needs an integer, got {raw!r}") from None

    while i < len(tokens):
        key = tokens[i]
        if key == "max_split_size_mb":
            mb = as_int(key, value_after(key))
            if mb < K_LARGE_BUFFER // _MB:
                raise fail(f"max_split_size_mb too small, must be >= {K_LARGE_BUFFER // _MB}")
            values["max_split_size_bytes"] = mb * _MB
        elif key == "max_non_split_rounding_mb":
            mb = as_int(key, value_after(key))
            if mb < K_LARGE_BUFFER // _MB:
                raise fail(f"max_non_split_rounding_mb too small, must be >= {K_LARGE_BUFFER // _MB}")
            values["max_non_split_rounding_bytes"] = mb * _MB
        elif key == "garbage_collection_threshold":
            raw = value_after(key)
            try:
                threshold = float(raw)
            except ValueError:
                raise fail(f"garbage_collection_threshold needs a number, got {raw!r}") from None
            if not 0.0 < threshold < 1.0:
                raise fail("garbage_collection_threshold must be in (0.0, 1.0)")
            values["garbage_collection_threshold"] = threshold
        elif key == "expandable_segments":
            raw = value_after(key)
            if raw not in ("True", "False"):
                raise fail(f"expandable_segments needs True or False, got {raw!r}")
            values["expandable_segments"] = raw == "True"
        elif key == "roundup_power2_divisions":
            i, divisions = _parse_divisions(tokens, i, fail)
            values["roundup_power2_divisions"] = divisions
        elif key == "backend":
            raw = value_after(key)
            if raw != "native":
                raise fail(f"backend {raw!r} is not modelled (only the native caching allocator is)")
        elif key in _IGNORED_KEYS:
            value_after(key)
        else:
            raise fail(f"unknown option {key!r} (valid: {', '.join(_KNOWN_KEYS)})")
        i += 1
        if i < len(tokens):
            if tokens[i] != ",":
                raise fail(f"expected ',' before {tokens[i]!r}")
            i += 1
    try:
        return AllocatorConfig(**values)
    except ValueError as exc:
        raise fail(str(exc)) from None


def _lex_alloc_conf(text: str) -> list[str]:
    """``AllocatorConfig::lexArgs``: ``, : [ ]`` are tokens of their own, spaces vanish."""
    tokens: list[str] = []
    buf: list[str] = []
    for ch in text:
        if ch in ",:[]":
            if buf:
                tokens.append("".join(buf))
                buf.clear()
            tokens.append(ch)
        elif ch != " ":
            buf.append(ch)
    if buf:
        tokens.append("".join(buf))
    return tokens


def _parse_divisions(tokens: list[str], i: int, fail: Any) -> tuple[int, int | tuple[int, ...]]:
    """Parse ``roundup_power2_divisions:N`` or ``:[MiB:N,...,>:N]`` starting at the key."""

    def power_of_two_or_zero(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise fail(f"roundup_power2_divisions needs integers, got {raw!r}") from None
        if value < 0 or (value and value & (value - 1)):
            raise fail(f"roundup_power2_divisions values must be 0 or a power of 2, got {value}")
        return value

    if i + 2 >= len(tokens) or tokens[i + 1] != ":":
        raise fail("expected 'roundup_power2_divisions:VALUE'")
    i += 2
    if tokens[i] != "[":
        return i, power_of_two_or_zero(tokens[i])
    table = [0] * K_ROUNDUP_INTERVALS
    first = True
    last_index = 0
    i += 1
    while True:
        if i >= len(tokens):
            raise fail("roundup_power2_divisions list is not closed with ']'")
        if tokens[i] == "]":
            return i, tuple(table)
        interval = tokens[i]
        if i + 2 >= len(tokens) or tokens[i + 1] != ":":
            raise fail("roundup_power2_divisions list entries look like 'MiB:N' or '>:N'")
        divisions = power_of_two_or_zero(tokens[i + 2])
        i += 3
        if interval == ">":
            # fills every interval after the last one named (AllocatorConfig test: 1024:4,>:1 keeps 1024 at 4)
            for j in range(last_index + 1 if not first else 0, K_ROUNDUP_INTERVALS):
                table[j] = divisions
        else:
            try:
                mib = int(interval)
            except ValueError:
                raise fail(f"roundup_power2_divisions interval must be MiB or '>', got {interval!r}") from None
            if mib <= 0 or mib & (mib - 1):
                raise fail(f"roundup_power2_divisions intervals must be powers of 2, got {mib}")
            index = min(mib.bit_length() - 1, K_ROUNDUP_INTERVALS - 1)
            if first:
                for j in range(index):
                    table[j] = divisions
            table[index] = divisions
            last_index = index
        first = False
        if i < len(tokens) and tokens[i] == ",":
            i += 1


# -- the allocator -------------------------------------------------------------------


class CachingAllocatorModel:
    """One device, one stream of PyTorch's DeviceCachingAllocator.

    ``malloc(nbytes)`` returns a block address or raises ``SimulatedOOM``;
    ``free(address)`` returns the block to its segment. ``allocated_bytes`` and
    ``reserved_bytes`` mirror ``torch.cuda.memory_allocated()`` /
    ``memory_reserved()`` (block sizes, not requested sizes).

    Not modelled: other streams and cross-stream frees (record_stream events),
    CUDA-graph private pools, free-memory callbacks, and memory outside the
    allocator (CUDA context, cuBLAS workspaces) that shrinks what a real device
    leaves for ``limit_bytes``. Addresses are the model's own, not the trace's.
    """

    def __init__(self, config: AllocatorConfig | None = None, *, device: int = 0):
        self.config = config = config or AllocatorConfig()
        self.device = device
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.num_alloc_retries = 0  # stats.num_alloc_retries: mallocs that needed the release-all retry
        self.num_ooms = 0
        self.num_device_alloc = 0  # cudaMalloc calls / page mappings
        self.num_device_free = 0  # cudaFree calls / page unmappings
        self._mss = config.max_split_size_bytes  # None = unlimited (SIZE_MAX in PyTorch)
        self._non_split_rounding = config.max_non_split_rounding_bytes
        self._limit = config.limit_bytes
        self._expandable = config.expandable_segments
        self._plain_rounding = config.roundup_power2_divisions in (0, 1) or (
            not isinstance(config.roundup_power2_divisions, int) and max(config.roundup_power2_divisions) <= 1
        )
        # Garbage collection only runs when a memory fraction is set (set_fraction in PyTorch).
        self._gc = config.garbage_collection_threshold > 0.0 and self._limit is not None
        self._gc_calls = [0, 0]  # get_free_blocks_call_count per pool [large, small]
        self._gc_base: dict[int, int] = {}  # free block -> pool call count when it was cached
        # Free (mapped) blocks per pool (index 0 = large, 1 = small): the distinct sizes, sorted,
        # and for each size the addresses, sorted. (size, address) order is the allocator's.
        self._sizes: tuple[list[int], list[int]] = ([], [])
        self._by_size: tuple[dict[int, list[int]], dict[int, list[int]]] = ({}, {})
        self._free_size: dict[int, int] = {}
        self._free_end: dict[int, int] = {}
        # Allocated blocks: address -> block size << _REQ_BITS | requested bytes (one dict, not two:
        # a replay does one store and one pop per block).
        self._alloc: dict[int, int] = {}
        # cudaMalloc'd segments: base -> (size, is_small). Expandable ones live in _es.
        self._segments: dict[int, tuple[int, bool]] = {}
        # Expandable segments: base -> (virtual size, page size, is_small), plus the
        # unmapped blocks of each pool (start -> size, end -> start).
        self._es: dict[int, tuple[int, int, bool]] = {}
        self._unmapped: tuple[dict[int, int], dict[int, int]] = ({}, {})
        self._unmapped_end: tuple[dict[int, int], dict[int, int]] = ({}, {})
        self._next_address = _BASE_ADDRESS

    # -- public API -------------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        """Allocate ``nbytes`` (> 0) and return the block's address."""
        if not 0 < nbytes <= _REQ_MASK:
            raise ValueError(f"cannot model a malloc of {nbytes} bytes (PyTorch returns no block for 0)")
        size = (nbytes + 511) & -512 if self._plain_rounding else self.config.round_size(nbytes)
        small = size <= K_SMALL_SIZE
        sizes = self._sizes[small]
        by_size = self._by_size[small]
        mss = self._mss
        if self._gc:
            self._gc_calls[small] += 1
        # get_free_block: lower_bound on (size, address)
        i = bisect_left(sizes, size)
        addr = -1
        if i < len(sizes):
            block_size = sizes[i]
            addrs = by_size[block_size]
            j = 0
            if self._expandable:
                block_size, addrs, j = self._expandable_best(sizes, i, small)
            if mss is None or ((block_size < mss) if size < mss else (block_size < size + self._non_split_rounding)):
                addr = addrs[j]
                if len(addrs) == 1:
                    del by_size[block_size]
                    del sizes[bisect_left(sizes, block_size)]
                else:
                    del addrs[j]
                del self._free_size[addr]
                del self._free_end[addr + block_size]
        if addr < 0:
            addr, block_size = self._alloc_new(size, small)
        # should_split
        remaining = block_size - size
        if remaining and (
            remaining >= K_MIN_BLOCK_SIZE
            if (small or self._expandable)
            else (remaining > K_SMALL_SIZE and (mss is None or size < mss))
        ):
            rest = addr + size
            same = by_size.get(remaining)
            if same is None:
                by_size[remaining] = [rest]
                insort(sizes, remaining)
            else:
                insort(same, rest)
            self._free_size[rest] = remaining
            self._free_end[rest + remaining] = rest
            if self._gc:
                self._gc_base[rest] = self._gc_calls[small]
            block_size = size
        self._alloc[addr] = block_size << _REQ_BITS | nbytes
        self.allocated_bytes += block_size
        return addr

    def free(self, addr: int) -> None:
        """Return the block at ``addr`` to the cache, merging it with free neighbours (free_block)."""
        size = self._alloc.pop(addr) >> _REQ_BITS
        self.allocated_bytes -= size
        small = size <= K_SMALL_SIZE  # allocated small-pool blocks are <= 1 MiB, large > 1 MiB
        sizes = self._sizes[small]
        by_size = self._by_size[small]
        free_size = self._free_size
        free_end = self._free_end
        end = addr + size
        other = free_size.pop(end, 0)
        if other:  # merge with the free block after
            addrs = by_size[other]
            if len(addrs) == 1:
                del by_size[other]
                del sizes[bisect_left(sizes, other)]
            else:
                del addrs[bisect_left(addrs, end)]
            del free_end[end + other]
            size += other
        prev = free_end.pop(addr, -1)
        if prev >= 0:  # merge with the free block before
            other = free_size.pop(prev)
            addrs = by_size[other]
            if len(addrs) == 1:
                del by_size[other]
                del sizes[bisect_left(sizes, other)]
            else:
                del addrs[bisect_left(addrs, prev)]
            addr = prev
            size += other
        same = by_size.get(size)
        if same is None:
            by_size[size] = [addr]
            insort(sizes, size)
        else:
            insort(same, addr)
        free_size[addr] = size
        free_end[addr + size] = addr
        if self._gc:
            self._gc_base[addr] = self._gc_calls[small]

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: release every cached segment that holds no live block."""
        self._release_cached_blocks()

    def largest_free_block(self) -> int:
        """Largest cached (mapped, unallocated) block in either pool."""
        return max((sizes[-1] for sizes in self._sizes if sizes), default=0)

    def segments(self) -> list[dict[str, Any]]:
        """Segments in the format of ``torch.cuda.memory._snapshot()["segments"]``, sorted by address."""
        out: list[dict[str, Any]] = []
        for base, (total, small) in self._segments.items():
            out.append(self._segment_dict(base, base + total, small, False))
        for base, (virtual, _page, small) in self._es.items():
            # PyTorch reports one segment per contiguous mapped range of an expandable segment.
            unmapped = self._unmapped[small]
            addr, end = base, base + virtual
            run_start = -1
            while addr < end:
                size = unmapped.get(addr)
                if size is not None:
                    if run_start >= 0:
                        out.append(self._segment_dict(run_start, addr, small, True))
                        run_start = -1
                else:
                    size = (self._alloc.get(addr, 0) >> _REQ_BITS) or self._free_size[addr]
                    if run_start < 0:
                        run_start = addr
                addr += size
            if run_start >= 0:
                out.append(self._segment_dict(run_start, end, small, True))
        out.sort(key=lambda s: s["address"])
        return out

    def layout(self) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
        """Cheap layout for heatmaps: mapped (start, size) ranges and (start, size, allocated) blocks."""
        ranges: list[tuple[int, int]] = [(base, size) for base, (size, _) in self._segments.items()]
        for base, (virtual, _page, small) in self._es.items():
            unmapped = self._unmapped[small]
            addr, end = base, base + virtual
            for start in sorted(a for a in unmapped if base <= a < end):
                if start > addr:
                    ranges.append((addr, start - addr))
                addr = start + unmapped[start]
            if addr < end:
                ranges.append((addr, end - addr))
        blocks = [(a, v >> _REQ_BITS, 1) for a, v in self._alloc.items()]
        blocks += [(a, s, 0) for a, s in self._free_size.items()]
        return ranges, blocks

    def check_invariants(self) -> None:
        """Assert the model's internal consistency (for tests; O(blocks))."""
        segs = self.segments()
        total = sum(s["total_size"] for s in segs)
        allocated = sum(s["allocated_size"] for s in segs)
        assert total == self.reserved_bytes, (total, self.reserved_bytes)
        assert allocated == self.allocated_bytes, (allocated, self.allocated_bytes)
        assert self.allocated_bytes <= self.reserved_bytes
        for seg in segs:
            addr = seg["address"]
            for block in seg["blocks"]:
                assert block["address"] == addr, "blocks must tile their segment"
                addr += block["size"]
            assert addr == seg["address"] + seg["total_size"]
        for pool in (0, 1):
            sizes, by_size = self._sizes[pool], self._by_size[pool]
            assert sizes == sorted(set(sizes)) and set(sizes) == set(by_size)
            for a, s in self._free_blocks(bool(pool)):
                assert by_size[s] == sorted(by_size[s])
                assert self._free_size[a] == s and self._free_end[a + s] == a
                if not self._expandable:
                    assert (s <= K_SMALL_BUFFER) if pool else (s > K_SMALL_SIZE)
        n_free = sum(len(addrs) for by_size in self._by_size for addrs in by_size.values())
        assert len(self._free_size) == len(self._free_end) == n_free

    # -- slow paths -------------------------------------------------------------------
    def _alloc_new(self, size: int, small: bool) -> tuple[int, int]:
        """malloc after get_free_block failed: GC, cudaMalloc, release oversize, release all, OOM."""
        alloc_size = _allocation_size(size)
        if self._gc:
            self._garbage_collect()
        found = self._alloc_block(size, alloc_size, small, retry=False)
        if found is None and self._release_available_cached_blocks(size, small):
            found = self._alloc_block(size, alloc_size, small, retry=False)
        if found is None:
            self._release_cached_blocks()
            found = self._alloc_block(size, alloc_size, small, retry=True)
        if found is None:
            self.num_ooms += 1
            raise SimulatedOOM(alloc_size, self.allocated_bytes, self.reserved_bytes, self._limit)
        return found

    def _alloc_block(self, size: int, alloc_size: int, small: bool, *, retry: bool) -> tuple[int, int] | None:
        if retry:
            self.num_alloc_retries += 1
        limit = self._limit
        if limit is not None and self.reserved_bytes + alloc_size > limit:
            return None
        if self._expandable:
            return self._try_allocate_expandable(size, small)
        base = self._take_address(alloc_size)
        self._segments[base] = (alloc_size, small)
        self.reserved_bytes += alloc_size
        self.num_device_alloc += 1
        return base, alloc_size

    def _take_address(self, nbytes: int) -> int:
        base = self._next_address
        self._next_address = base + -(-nbytes // _SEGMENT_GAP) * _SEGMENT_GAP + _SEGMENT_GAP
        return base

    def _free_blocks(self, small: bool, *, descending: bool = False) -> list[tuple[int, int]]:
        """Cached blocks of a pool as (address, size), in the allocator's (size, address) order."""
        by_size = self._by_size[small]
        out = [(a, s) for s in self._sizes[small] for a in by_size[s]]
        return out[::-1] if descending else out

    def _remove_free(self, addr: int, small: bool) -> int:
        size = self._free_size.pop(addr)
        del self._free_end[addr + size]
        addrs = self._by_size[small][size]
        if len(addrs) == 1:
            del self._by_size[small][size]
            sizes = self._sizes[small]
            del sizes[bisect_left(sizes, size)]
        else:
            del addrs[bisect_left(addrs, addr)]
        self._gc_base.pop(addr, None)
        return size

    def _insert_free(self, addr: int, size: int, small: bool) -> None:
        addrs = self._by_size[small].get(size)
        if addrs is None:
            self._by_size[small][size] = [addr]
            insort(self._sizes[small], size)
        else:
            insort(addrs, addr)
        self._free_size[addr] = size
        self._free_end[addr + size] = addr
        if self._gc:
            self._gc_base[addr] = self._gc_calls[small]

    def _is_whole_segment(self, addr: int, size: int) -> bool:
        seg = self._segments.get(addr)
        return seg is not None and seg[0] == size

    def _release_block(self, addr: int, small: bool) -> None:
        """release_block: cudaFree a cached segment that is one free block."""
        size = self._remove_free(addr, small)
        del self._segments[addr]
        self.reserved_bytes -= size
        self.num_device_free += 1

    def _release_available_cached_blocks(self, size: int, small: bool) -> bool:
        """Free oversize cached blocks (>= max_split_size): the smallest big enough, else largest first."""
        mss = self._mss
        if mss is None:
            return False
        sizes = self._sizes[small]
        target = max(size, mss)
        i = bisect_left(sizes, target)
        if i < len(sizes):
            block_size = sizes[i]
            addr = self._by_size[small][block_size][0]
            if not self._is_whole_segment(addr, block_size):
                return False  # expandable or split block: PyTorch never releases those here
            self._release_block(addr, small)
            return True
        # no single block is big enough: release oversize blocks from the largest down
        released = 0
        for addr, block_size in self._free_blocks(small, descending=True):
            if released >= target or block_size < mss or not self._is_whole_segment(addr, block_size):
                break
            released += block_size
            self._release_block(addr, small)
        return released >= target

    def _release_cached_blocks(self) -> None:
        """release_cached_blocks: free every non-split cached segment; unmap free expandable pages."""
        for small in (False, True):
            to_unmap = []
            for addr, size in self._free_blocks(small):
                if self._expandable:
                    to_unmap.append((addr, size))
                elif self._is_whole_segment(addr, size):
                    self._release_block(addr, small)
            for addr, size in to_unmap:
                self._unmap_block(addr, size, small)

    def _garbage_collect(self) -> None:
        """garbage_collect_cached_blocks: free old non-split large blocks above the GC threshold."""
        assert self._limit is not None
        threshold = int(self.config.garbage_collection_threshold * self._limit)
        if self.reserved_bytes <= threshold:
            return
        target = self.reserved_bytes - threshold
        calls = self._gc_calls[0]

        def freeable() -> list[tuple[int, int, int]]:
            out = []
            for addr, size in self._free_blocks(False):
                if self._is_whole_segment(addr, size):
                    out.append((addr, size, calls - self._gc_base.get(addr, calls)))
            return out

        blocks = freeable()
        if not blocks:
            return
        total_age = sum(age for _, _, age in blocks)
        count = len(blocks)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for addr, size, age in freeable():
                if age >= age_threshold:
                    freed = True
                    reclaimed += size
                    total_age -= age
                    count -= 1
                    self._release_block(addr, False)

    # -- expandable segments ------------------------------------------------------------
    def _expandable_best(self, sizes: list[int], i: int, small: bool) -> tuple[int, list[int], int]:
        """get_free_block with expandable segments: a block's size counts the unmapped space after it.

        Walks blocks in (size, address) order from the best fit while the next one's
        expandable size is smaller. Returns (size, that size's address list, index).
        """
        unmapped = self._unmapped[small]
        by_size = self._by_size[small]
        size = sizes[i]
        addrs = by_size[size]
        j = 0
        current = size + unmapped.get(addrs[0] + size, 0)
        while True:
            if j + 1 < len(addrs):
                next_size, next_addrs, next_j = size, addrs, j + 1
            elif i + 1 < len(sizes):
                next_size = sizes[i + 1]
                next_addrs, next_j = by_size[next_size], 0
            else:
                break
            candidate = next_size + unmapped.get(next_addrs[next_j] + next_size, 0)
            if candidate >= current:
                break
            if next_addrs is not addrs:
                i += 1
            size, addrs, j, current = next_size, next_addrs, next_j, candidate
        return size, addrs, j

    def _segment_of(self, addr: int) -> tuple[int, int, int, bool]:
        bases = sorted(self._es)
        base = bases[bisect_right(bases, addr) - 1]
        virtual, page, small = self._es[base]
        return base, virtual, page, small

    def _find_expandable_block(self, size: int, small: bool) -> int:
        """Lowest address where free + unmapped space adds up to ``size``; a new segment if none."""
        unmapped = self._unmapped[small]
        free_size = self._free_size
        for start in sorted(unmapped):
            candidate = self._free_end.get(start, start)  # a free block right before the gap
            room, addr = 0, candidate
            while room < size:
                step = free_size.get(addr) or unmapped.get(addr)
                if not step:
                    break
                room += step
                addr += step
            if room >= size:
                return candidate
        page = K_SMALL_PAGE if small else K_LARGE_PAGE
        device_bytes = self._limit if self._limit else _DEFAULT_DEVICE_BYTES
        virtual = -(-(device_bytes + device_bytes // 8) // page) * page
        virtual = max(virtual, -(-size // page) * page)
        base = self._take_address(virtual)
        self._es[base] = (virtual, page, small)
        unmapped[base] = virtual
        self._unmapped_end[small][base + virtual] = base
        return base

    def _try_allocate_expandable(self, size: int, small: bool) -> tuple[int, int] | None:
        candidate = self._find_expandable_block(size, small)
        unmapped = self._unmapped[small]
        if candidate in unmapped:
            mapped = self._map_block(candidate, min(unmapped[candidate], size), small)
            if mapped is None:
                return None
            candidate = mapped
        while self._free_size[candidate] < size:
            after = candidate + self._free_size[candidate]  # invariant: free -> unmapped
            remaining = size - self._free_size[candidate]
            mapped = self._map_block(after, min(remaining, unmapped[after]), small)
            if mapped is None:
                return None
            candidate = mapped
        return candidate, self._remove_free(candidate, small)

    def _map_block(self, addr: int, nbytes: int, small: bool) -> int | None:
        """Map whole pages over [addr, addr + nbytes) of an unmapped block; return the merged free block."""
        base, _virtual, page, _ = self._segment_of(addr)
        mapped = -(-nbytes // page) * page
        if self._limit is not None and self.reserved_bytes + mapped > self._limit:
            return None  # cuMemCreate fails: the device is out of physical memory
        unmapped, unmapped_end = self._unmapped[small], self._unmapped_end[small]
        size = unmapped.pop(addr)
        del unmapped_end[addr + size]
        if mapped < size:
            unmapped[addr + mapped] = size - mapped
            unmapped_end[addr + size] = addr + mapped
        start, total = addr, mapped
        prev = self._free_end.get(addr)
        if prev is not None:
            total += self._remove_free(prev, small)
            start = prev
        if addr + mapped in self._free_size:
            total += self._remove_free(addr + mapped, small)
        self._insert_free(start, total, small)
        self.reserved_bytes += mapped
        self.num_device_alloc += 1
        return start

    def _unmap_block(self, addr: int, size: int, small: bool) -> None:
        """unmap_block: give back the whole pages inside a free block; release an empty segment."""
        base, virtual, page, _ = self._segment_of(addr)
        first_page = -(-(addr - base) // page)
        end_page = (addr + size - base) // page
        if first_page >= end_page:
            return
        start, end = base + first_page * page, base + end_page * page
        self._remove_free(addr, small)
        if start > addr:
            self._insert_free(addr, start - addr, small)
        if addr + size > end:
            self._insert_free(end, addr + size - end, small)
        self.reserved_bytes -= end - start
        self.num_device_free += 1
        unmapped, unmapped_end = self._unmapped[small], self._unmapped_end[small]
        lo, hi = start, end
        before = unmapped_end.pop(start, None)
        if before is not None:
            del unmapped[before]
            lo = before
        after = unmapped.pop(end, None)
        if after is not None:
            del unmapped_end[end + after]
            hi = end + after
        if lo == base and hi == base + virtual:
            del self._es[base]  # release_expandable_segment: nothing mapped is left
            return
        unmapped[lo] = hi - lo
        unmapped_end[hi] = lo

    # -- snapshot -----------------------------------------------------------------------
    def _segment_dict(self, start: int, end: int, small: bool, expandable: bool) -> dict[str, Any]:
        blocks = []
        allocated = requested = 0
        addr = start
        while addr < end:
            packed = self._alloc.get(addr)
            if packed is not None:
                size, req = packed >> _REQ_BITS, packed & _REQ_MASK
                allocated += size
                requested += req
                blocks.append(
                    {"address": addr, "size": size, "requested_size": req, "state": "active_allocated", "frames": []}
                )
            else:
                size = self._free_size[addr]
                blocks.append({"address": addr, "size": size, "requested_size": 0, "state": "inactive", "frames": []})
            addr += size
        return {
            "device": self.device,
            "address": start,
            "total_size": end - start,
            "allocated_size": allocated,
            "active_size": allocated,
            "requested_size": requested,
            "stream": 0,
            "segment_type": "small" if small else "large",
            "segment_pool_id": (0, 0),
            "is_expandable": expandable,
            "frames": [],
            "blocks": blocks,
        }


def _allocation_size(size: int) -> int:
    """get_allocation_size: the segment cudaMalloc'd for a request of ``size`` rounded bytes."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


# -- replay --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, eq=False)
class LayoutHistory:
    """Downsampled device-memory layout over a replay, for heatmaps.

    Column ``c`` is the state after trace row ``event_index[c]``: the reserved
    (mapped) address ranges and the blocks in them. Addresses are the model's.
    """

    event_index: np.ndarray  # (C,) trace row of each column
    segments: list[np.ndarray]  # C arrays of shape (S, 2): start, size
    blocks: list[np.ndarray]  # C arrays of shape (B, 3): start, size, allocated (1) / cached free (0)
    allocator: str = "pytorch"


@dataclass(frozen=True, kw_only=True, eq=False)
class ReplayResult:
    """What a trace does to an allocator. ``to_json`` gives the scalar summary."""

    allocator: str
    config: AllocatorConfig
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    fragmentation: float  # 1 - allocated/reserved at the reserved peak
    reserved_unallocated_at_peak_bytes: int
    largest_free_block_at_peak_bytes: int
    segments_at_peak: int
    num_alloc_retries: int
    oom_at_event: int | None  # trace row whose allocation failed; replay stops there
    peak_event: int  # trace row at which reserved first reached its peak (-1: no allocations)
    allocated_bytes: np.ndarray  # after each trace row (rows 0 .. last replayed row)
    reserved_bytes: np.ndarray
    segments_at_peak_snapshot: list[dict[str, Any]] = field(default_factory=list)
    segments_at_end_snapshot: list[dict[str, Any]] = field(default_factory=list)
    history: LayoutHistory | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "peak_allocated_bytes": int(self.peak_allocated_bytes),
            "peak_reserved_bytes": int(self.peak_reserved_bytes),
            "fragmentation": float(self.fragmentation),
            "reserved_unallocated_at_peak_bytes": int(self.reserved_unallocated_at_peak_bytes),
            "largest_free_block_at_peak_bytes": int(self.largest_free_block_at_peak_bytes),
            "segments_at_peak": int(self.segments_at_peak),
            "num_alloc_retries": int(self.num_alloc_retries),
            "oom_at_event": None if self.oom_at_event is None else int(self.oom_at_event),
        }


ALLOCATORS: tuple[str, ...] = ("pytorch", "pytorch-expandable", "arena")


def replay(
    trace: Trace,
    config: AllocatorConfig | None = None,
    device: int = 0,
    *,
    allocator: str = "pytorch",
    history_columns: int = 0,
    arena_strategy: str = "best",
) -> ReplayResult:
    """Replay the ALLOC/PREEXISTING/FREE rows of ``device`` through an allocator model.

    ``allocator``: ``"pytorch"`` (the caching allocator with ``config``),
    ``"pytorch-expandable"`` (the same with ``expandable_segments``) or
    ``"arena"`` (the static arena plan of ``memwarden.plan.arena``: reserved is the
    arena size throughout). MAP/UNMAP rows are file-backed memory no allocator sees
    and are skipped. A FREE whose ALLOC is not in the trace is ignored. With
    ``history_columns > 0`` about that many evenly spaced layout columns are
    recorded for ``memwarden.report.heatmap``.
    """
    config = config or AllocatorConfig()
    if allocator not in ALLOCATORS:
        raise ValueError(f"unknown allocator {allocator!r} (valid: {', '.join(ALLOCATORS)})")
    if allocator == "arena":
        from memwarden.plan.arena import replay_arena

        return replay_arena(trace, config, device, strategy=arena_strategy, history_columns=history_columns)
    if allocator == "pytorch-expandable" and not config.expandable_segments:
        config = dataclasses.replace(config, expandable_segments=True)
    name = "pytorch-expandable" if config.expandable_segments else "pytorch"

    rows, acts, tensors, nbytes = _allocator_rows(trace, device)
    n_rows = len(rows)
    columns = _history_positions(n_rows, history_columns)

    model = CachingAllocatorModel(config, device=device)
    allocated, reserved, stop, layouts = _run(model, acts, tensors, nbytes, n_rows, columns)
    oom_at_event = int(rows[stop]) if stop < n_rows else None
    replayed = stop + 1 if stop < n_rows else n_rows
    alloc_arr = np.asarray(allocated, dtype=np.int64)
    res_arr = np.asarray(reserved, dtype=np.int64)

    if replayed and int(res_arr.max()) > 0:
        peak_j = int(np.argmax(res_arr))
        # The allocator is deterministic: replay again up to the peak to see its layout there.
        peak_model = CachingAllocatorModel(config, device=device)
        _run(peak_model, acts, tensors, nbytes, peak_j + 1, [])
        peak_segments = peak_model.segments()
        peak_event = int(rows[peak_j])
        peak_reserved = peak_model.reserved_bytes
        peak_alloc_at = peak_model.allocated_bytes
        largest_free = peak_model.largest_free_block()
    else:
        peak_segments, peak_event, peak_reserved, peak_alloc_at, largest_free = [], -1, 0, 0, 0

    history = None
    if columns:
        cols = columns[: len(layouts)]
        history = LayoutHistory(
            event_index=rows[np.asarray(cols, dtype=np.int64)] if cols else np.zeros(0, np.int64),
            segments=[layout[0] for layout in layouts],
            blocks=[layout[1] for layout in layouts],
            allocator=name,
        )
    return ReplayResult(
        allocator=name,
        config=config,
        peak_allocated_bytes=int(alloc_arr.max()) if replayed else 0,
        peak_reserved_bytes=peak_reserved,
        fragmentation=(1.0 - peak_alloc_at / peak_reserved) if peak_reserved else 0.0,
        reserved_unallocated_at_peak_bytes=peak_reserved - peak_alloc_at,
        largest_free_block_at_peak_bytes=largest_free,
        segments_at_peak=len(peak_segments),
        num_alloc_retries=model.num_alloc_retries,
        oom_at_event=oom_at_event,
        peak_event=peak_event,
        allocated_bytes=_per_row(trace.num_events, rows[:replayed], alloc_arr[:replayed], oom_at_event),
        reserved_bytes=_per_row(trace.num_events, rows[:replayed], res_arr[:replayed], oom_at_event),
        segments_at_peak_snapshot=peak_segments,
        segments_at_end_snapshot=model.segments(),
        history=history,
    )


def _allocator_rows(trace: Trace, device: int) -> tuple[np.ndarray, list[int], list[int], list[int]]:
    """Trace rows an allocator sees on ``device``: ALLOC/PREEXISTING (as 0) and FREE (as 1)."""
    ev = trace.events
    action = ev["action"]
    is_alloc = (action == Action.ALLOC) | (action == Action.PREEXISTING)
    mask = (ev["device"] == device) & (is_alloc | (action == Action.FREE))
    rows = np.flatnonzero(mask)
    acts = (~is_alloc[rows]).astype(np.int8).tolist()
    return rows, acts, ev["tensor"][rows].tolist(), ev["nbytes"][rows].tolist()


def _history_positions(n_rows: int, columns: int) -> list[int]:
    if columns <= 0 or n_rows == 0:
        return []
    return sorted({int(x) for x in np.linspace(0, n_rows - 1, min(columns, n_rows)).round()})


def _run(
    model: CachingAllocatorModel,
    acts: list[int],
    tensors: list[int],
    nbytes: list[int],
    stop: int,
    columns: list[int],
) -> tuple[list[int], list[int], int, list[tuple[np.ndarray, np.ndarray]]]:
    """Replay rows ``[0, stop)``. Returns per-row allocated/reserved, the OOM row (or ``stop``), layouts.

    The hot loop: one ``malloc``/``free`` call per row and a list store. (Inlining
    the model's fast paths here was measured at under 3% faster; not worth two copies.)
    """
    malloc, free = model.malloc, model.free
    live: dict[int, int] = {}
    live_pop = live.pop
    allocated = [0] * stop
    # reserved changes only when a segment is made or released: keep (row, value) changes.
    reserved_rows: list[int] = [0]
    reserved_values: list[int] = [model.reserved_bytes]
    reserved_now = model.reserved_bytes
    layouts: list[tuple[np.ndarray, np.ndarray]] = []
    next_column = columns[0] if columns else -1
    col_i = 0
    for j in range(stop):
        if acts[j]:
            addr = live_pop(tensors[j], -1)
            if addr >= 0:
                free(addr)
        else:
            n = nbytes[j]
            if n > 0:
                try:
                    live[tensors[j]] = malloc(n)
                except SimulatedOOM:
                    del allocated[j:]
                    allocated.append(model.allocated_bytes)
                    reserved_rows.append(j)
                    reserved_values.append(model.reserved_bytes)
                    return allocated, _expand(reserved_rows, reserved_values, j + 1), j, layouts
                if model.reserved_bytes != reserved_now:
                    reserved_now = model.reserved_bytes
                    reserved_rows.append(j)
                    reserved_values.append(reserved_now)
        allocated[j] = model.allocated_bytes
        if j == next_column:
            layouts.append(_layout_arrays(model))
            col_i += 1
            next_column = columns[col_i] if col_i < len(columns) else -1
    return allocated, _expand(reserved_rows, reserved_values, stop), stop, layouts


def _expand(rows: list[int], values: list[int], length: int) -> list[int]:
    """Per-row values from (row, value) change points (the last change at a row wins)."""
    if length == 0:
        return []
    out = np.zeros(length, dtype=np.int64)
    marker = np.full(length, -1, dtype=np.int64)
    marker[np.asarray(rows, dtype=np.int64)] = np.arange(len(rows))
    idx = np.maximum.accumulate(marker)
    out[idx >= 0] = np.asarray(values, dtype=np.int64)[idx[idx >= 0]]
    return out.tolist()


def _layout_arrays(model: CachingAllocatorModel) -> tuple[np.ndarray, np.ndarray]:
    ranges, blocks = model.layout()
    return np.asarray(ranges, dtype=np.int64).reshape(-1, 2), np.asarray(blocks, dtype=np.int64).reshape(-1, 3)


def _per_row(num_events: int, rows: np.ndarray, values: np.ndarray, oom_at_event: int | None) -> np.ndarray:
    """Spread values known at ``rows`` over every trace row (carry forward); cut after an OOM."""
    length = num_events if oom_at_event is None else oom_at_event + 1
    out = np.zeros(length, dtype=np.int64)
    if len(rows) == 0:
        return out
    marker = np.full(length, -1, dtype=np.int64)
    marker[rows] = np.arange(len(rows))
    idx = np.maximum.accumulate(marker)
    has = idx >= 0
    out[has] = values[idx[has]]
    return out
