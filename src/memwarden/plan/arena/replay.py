"""``replay(..., allocator="arena")``: a trace replayed through its static arena plan."""

from __future__ import annotations

from typing import Any

import numpy as np

from memwarden.plan.allocator.config import AllocatorConfig
from memwarden.plan.arena.plan import DEFAULT_ALIGNMENT, lifetimes, plan_arena
from memwarden.plan.records import LayoutHistory, ReplayResult
from memwarden.trace.model import Trace


def replay_arena(
    trace: Trace,
    config: AllocatorConfig | None = None,
    device: int = 0,
    *,
    strategy: str = "best",
    alignment: int = DEFAULT_ALIGNMENT,
    history_columns: int = 0,
) -> ReplayResult:
    """``replay(..., allocator="arena")``: every tensor at its planned offset, the arena reserved up front.

    Reserved is ``arena_bytes`` from the first allocation on; allocated is the live
    (aligned) tensor bytes. The "peak" moment is the row where allocated is highest.
    With ``config.limit_bytes`` below the arena size the first allocation fails.
    """
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
