"""Read-only views of a ``CachingAllocatorModel``: its segments in PyTorch's snapshot format,
a cheap layout for heatmaps, and the consistency checks the tests run.

Kept apart from the model (``memwarden.plan.allocator.model``), which holds the allocation rules;
these functions only read its state (the model's methods of the same names call them).
"""

from __future__ import annotations

from typing import Any, Protocol

from memwarden.interop.cuda_blocks import K_SMALL_SIZE
from memwarden.plan.allocator.config import K_SMALL_BUFFER, REQ_BITS, REQ_MASK


class AllocatorState(Protocol):
    """What these views read of a ``CachingAllocatorModel`` (model.py), which calls them."""

    _segments: dict[int, Any]
    _es: dict[int, Any]
    _unmapped: Any
    _alloc: dict[int, int]
    _free_size: dict[int, int]
    _sizes: Any
    _by_size: Any
    _free_end: dict[int, int]
    _expandable: bool
    device: int
    reserved_bytes: int
    allocated_bytes: int

    def segments(self) -> list[dict[str, Any]]: ...

    def _free_blocks(self, small: bool) -> Any: ...


def segments(model: AllocatorState) -> list[dict[str, Any]]:
    """Segments in the format of ``torch.cuda.memory._snapshot()["segments"]``, sorted by address."""
    out: list[dict[str, Any]] = []
    for base, (total, small) in model._segments.items():
        out.append(_segment_dict(model, base, base + total, small, False))
    for base, (virtual, _page, small) in model._es.items():
        # PyTorch reports one segment per contiguous mapped range of an expandable segment.
        unmapped = model._unmapped[small]
        addr, end = base, base + virtual
        run_start = -1
        while addr < end:
            size = unmapped.get(addr)
            if size is not None:
                if run_start >= 0:
                    out.append(_segment_dict(model, run_start, addr, small, True))
                    run_start = -1
            else:
                size = (model._alloc.get(addr, 0) >> REQ_BITS) or model._free_size[addr]
                if run_start < 0:
                    run_start = addr
            addr += size
        if run_start >= 0:
            out.append(_segment_dict(model, run_start, end, small, True))
    out.sort(key=lambda s: s["address"])
    return out


def layout(model: AllocatorState) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
    """Cheap layout for heatmaps: mapped (start, size) ranges and (start, size, allocated) blocks."""
    ranges: list[tuple[int, int]] = [(base, size) for base, (size, _) in model._segments.items()]
    for base, (virtual, _page, small) in model._es.items():
        unmapped = model._unmapped[small]
        addr, end = base, base + virtual
        for start in sorted(a for a in unmapped if base <= a < end):
            if start > addr:
                ranges.append((addr, start - addr))
            addr = start + unmapped[start]
        if addr < end:
            ranges.append((addr, end - addr))
    blocks = [(a, v >> REQ_BITS, 1) for a, v in model._alloc.items()]
    blocks += [(a, s, 0) for a, s in model._free_size.items()]
    return ranges, blocks


def check_invariants(model: AllocatorState) -> None:
    """Assert the model's internal consistency (for tests; O(blocks))."""
    segs = model.segments()
    total = sum(s["total_size"] for s in segs)
    allocated = sum(s["allocated_size"] for s in segs)
    assert total == model.reserved_bytes, (total, model.reserved_bytes)
    assert allocated == model.allocated_bytes, (allocated, model.allocated_bytes)
    assert model.allocated_bytes <= model.reserved_bytes
    for seg in segs:
        addr = seg["address"]
        for block in seg["blocks"]:
            assert block["address"] == addr, "blocks must tile their segment"
            addr += block["size"]
        assert addr == seg["address"] + seg["total_size"]
    for pool in (0, 1):
        sizes, by_size = model._sizes[pool], model._by_size[pool]
        assert sizes == sorted(set(sizes)) and set(sizes) == set(by_size)
        for a, s in model._free_blocks(bool(pool)):
            assert by_size[s] == sorted(by_size[s])
            assert model._free_size[a] == s and model._free_end[a + s] == a
            if not model._expandable:
                assert (s <= K_SMALL_BUFFER) if pool else (s > K_SMALL_SIZE)
    n_free = sum(len(addrs) for by_size in model._by_size for addrs in by_size.values())
    assert len(model._free_size) == len(model._free_end) == n_free


def _segment_dict(model: AllocatorState, start: int, end: int, small: bool, expandable: bool) -> dict[str, Any]:
    blocks = []
    allocated = requested = 0
    addr = start
    while addr < end:
        packed = model._alloc.get(addr)
        if packed is not None:
            size, req = packed >> REQ_BITS, packed & REQ_MASK
            allocated += size
            requested += req
            blocks.append(
                {"address": addr, "size": size, "requested_size": req, "state": "active_allocated", "frames": []}
            )
        else:
            size = model._free_size[addr]
            blocks.append({"address": addr, "size": size, "requested_size": 0, "state": "inactive", "frames": []})
        addr += size
    return {
        "device": model.device,
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
