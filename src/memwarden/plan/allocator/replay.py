"""Trace replay through the caching-allocator model of ``memwarden.plan.allocator.model``.

``replay_caching(trace)`` answers "what would ``torch.cuda.memory_reserved()`` have been?"
for a recorded allocation sequence: the allocator rounds requests, carves them
out of cached segments, and keeps freed blocks cached, so reserved memory runs
ahead of live tensor bytes. The difference at the reserved peak is the
fragmentation that the ``fragmentation`` pattern reports.
"""

from __future__ import annotations

import numpy as np

from memwarden.plan.allocator.config import AllocatorConfig, SimulatedOOM
from memwarden.plan.allocator.model import CachingAllocatorModel
from memwarden.plan.records import LayoutHistory, ReplayResult
from memwarden.trace.model import Action, Trace

__all__ = ["replay_caching"]


def replay_caching(
    trace: Trace,
    config: AllocatorConfig | None = None,
    device: int = 0,
    *,
    history_columns: int = 0,
) -> ReplayResult:
    """Replay the ALLOC/PREEXISTING/FREE rows of ``device`` through the caching allocator with
    ``config`` (``expandable_segments`` in it picks that mode). MAP/UNMAP rows are file-backed
    memory no allocator sees and are skipped. A FREE whose ALLOC is not in the trace is ignored.
    With ``history_columns > 0`` about that many evenly spaced layout columns are recorded for
    ``memwarden.report.heatmap``.
    """
    config = config or AllocatorConfig()
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
