"""A pure-Python model of PyTorch's CUDA caching allocator: ``CachingAllocatorModel``.

The rules follow ``c10/cuda/CUDACachingAllocator.cpp`` (DeviceCachingAllocator:
``malloc``, ``get_free_block``, ``should_split``, ``alloc_block``,
``release_available_cached_blocks``, ``release_cached_blocks``, ``free_block``,
``try_merge_blocks`` and the expandable-segment functions). One stream, no CUDA
graphs, no cross-stream events. The settings, their ``PYTORCH_CUDA_ALLOC_CONF``
parsing and the allocator's constants live in ``memwarden.plan.allocator.config``;
trace replay through the model in ``memwarden.plan.allocator.replay``. The model's read-only
views (``segments``, ``layout``, ``check_invariants``) are in ``memwarden.plan.allocator.views``.

Why it is fast: see the package docstring (``memwarden.plan.allocator``). ``limit_bytes`` plays both parts a real limit can: the
``set_per_process_memory_fraction`` check before every cudaMalloc/mapping
(``reserved + segment size > limit`` fails) and the device running out of
physical pages when an expandable segment grows.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import Any

from memwarden.interop.cuda_blocks import K_MIN_BLOCK_SIZE, K_SMALL_SIZE
from memwarden.plan.allocator import views as alloc_views
from memwarden.plan.allocator.config import (
    K_LARGE_PAGE,
    K_SMALL_PAGE,
    REQ_BITS,
    REQ_MASK,
    AllocatorConfig,
    SimulatedOOM,
    SizeLimitError,
    allocation_size,
)

__all__ = ["CachingAllocatorModel"]

# Model-only layout: segments get addresses from a bump pointer with a gap after each,
# so two segments never touch and blocks of different segments can never merge.
_BASE_ADDRESS = 1 << 40
_SEGMENT_GAP = 2 << 20
# Expandable segments reserve 1 1/8 of device memory as address space
# (find_expandable_block); with no device limit we assume this much device memory.
_DEFAULT_DEVICE_BYTES = 1 << 40


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
        # Allocated blocks: address -> block size << REQ_BITS | requested bytes (one dict, not two:
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
        if nbytes > REQ_MASK:
            raise SizeLimitError(f"cannot model a malloc of {nbytes} bytes (the model packs sizes in 48 bits)")
        if nbytes <= 0:
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
        self._alloc[addr] = block_size << REQ_BITS | nbytes
        self.allocated_bytes += block_size
        return addr

    def free(self, addr: int) -> None:
        """Return the block at ``addr`` to the cache, merging it with free neighbours (free_block)."""
        size = self._alloc.pop(addr) >> REQ_BITS
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
        return alloc_views.segments(self)

    def layout(self) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
        """Cheap layout for heatmaps: mapped (start, size) ranges and (start, size, allocated) blocks."""
        return alloc_views.layout(self)

    def check_invariants(self) -> None:
        """Assert the model's internal consistency (for tests; O(blocks))."""
        alloc_views.check_invariants(self)

    # -- slow paths -------------------------------------------------------------------
    def _alloc_new(self, size: int, small: bool) -> tuple[int, int]:
        """malloc after get_free_block failed: GC, cudaMalloc, release oversize, release all, OOM."""
        alloc_size = allocation_size(size)
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
