"""What replaying a trace through an allocator gives: ``ReplayResult`` (the scalar answer
and per-row curves) and ``LayoutHistory`` (the downsampled layout, for heatmaps). Shared by
the caching-allocator replay (``plan.allocator.replay``) and the arena replay
(``plan.arena.replay``); ``plan.replay`` picks between them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memwarden.plan.allocator.config import AllocatorConfig

__all__ = ["LayoutHistory", "ReplayResult"]


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
