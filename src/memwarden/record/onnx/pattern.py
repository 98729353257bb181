"""ORT's memory pattern, recomputed from a replayed run.

With ``enable_mem_pattern`` ORT's first run of a session at given input shapes traces every
planned activation (not graph outputs, not kernel scratch) through its ``MemPatternPlanner``
(onnxruntime/core/framework/mem_pattern_planner.h): each allocation goes to the best-fitting gap
between the live blocks (least waste), else to the end. From the second run at those shapes ORT
allocates one buffer of the pattern's total size when the run starts and places every planned
tensor at its offset in it, so the run holds the whole buffer from its first kernel to its
last, whatever is live inside it. ``pattern_bytes`` replays that planner over the allocation
order of a run; the capture adds the buffer's unused part as a ``mem_pattern`` block.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["PATTERN_ALIGN", "pattern_bytes"]

PATTERN_ALIGN = 64  # ORT pads every planned tensor to its CPU allocation alignment (kAllocAlignment)


def pattern_bytes(trace: Iterable[tuple[bool, int, int]]) -> int:
    """Total size of the pattern buffer for ``trace``: (allocate?, block id, bytes) in run order.

    ``blocks`` is kept sorted by offset, as ORT's list is; a free removes the block, an allocation
    takes the gap with the least waste (earliest on ties), the tail above the highest block
    counting as a gap up to the buffer's current size, else extends the buffer at the top.
    """
    placed: dict[int, tuple[int, int]] = {}  # block id -> (offset, size)
    blocks: list[int] = []  # live block ids, by offset
    buffer_size = 0
    for allocate, block, nbytes in trace:
        if not allocate:
            if block in placed:
                blocks.remove(block)
                del placed[block]
            continue
        size = (nbytes + PATTERN_ALIGN - 1) // PATTERN_ALIGN * PATTERN_ALIGN
        if size == 0:
            continue
        current = 0
        waste = None
        best = placed[blocks[-1]][0] + placed[blocks[-1]][1] if blocks else 0
        for other in blocks:
            offset, other_size = placed[other]
            if offset >= current:
                gap = offset - current
                if gap >= size and (waste is None or gap - size < waste):
                    waste, best = gap - size, current
            current = max(current, offset + other_size)
        if current < buffer_size:
            gap = buffer_size - current
            if gap >= size and (waste is None or gap - size < waste):
                best = current
        buffer_size = max(buffer_size, best + size)
        placed[block] = (best, size)
        # insert before the first block at or after ``best`` that is further on or at least as big
        at = len(blocks)
        for i, other in enumerate(blocks):
            offset, other_size = placed[other]
            if offset < best:
                continue
            if offset > best or other_size >= size:
                at = i
                break
        blocks.insert(at, block)
    return buffer_size
