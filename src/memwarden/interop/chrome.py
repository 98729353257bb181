"""Chrome trace-event JSON of a Trace, for Perfetto (ui.perfetto.dev) and chrome://tracing.

Layout (the JSON Object Format of the Trace Event spec):
  * process "memwarden spans": one thread each for module calls, phases,
    steps and marks; module/phase/step spans are complete ("X") events.
  * one process per device: counter ("C") tracks of live bytes per category,
    total live bytes, and reserved bytes when the trace has allocator segments;
    OOMs are instant events there.
Timestamps are the trace's microseconds, unchanged.

Counters get one event per change, merged per timestamp (the last value at a
timestamp wins). Past ``max_counter_points`` in all, each series is thinned by
buckets that keep their highest point and their last one, so peaks and final
values survive.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.trace.io import atomic_write
from memwarden.trace.model import Action, Category, Modality, Phase, SpanKind, Trace, enum_name

__all__ = ["MAX_COUNTER_POINTS", "save_chrome", "to_chrome"]

MAX_COUNTER_POINTS = 20_000  # Perfetto stays responsive well past this; chrome://tracing less so
SPANS_PID = 1
_DEVICE_PID_BASE = 10
_SPAN_TIDS = {SpanKind.MODULE: 1, SpanKind.PHASE: 2, SpanKind.STEP: 3, SpanKind.MARK: 4}
_SPAN_THREADS = {SpanKind.MODULE: "modules", SpanKind.PHASE: "phases", SpanKind.STEP: "steps", SpanKind.MARK: "marks"}


def _last_per_timestamp(times: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    last = np.ones(len(times), dtype=bool)
    last[:-1] = times[1:] != times[:-1]
    return times[last], values[last]


def _thin(times: np.ndarray, values: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep at most ~max_points: per bucket its maximum and its last point (plus the first point)."""
    n = len(times)
    if n <= max_points:
        return times, values
    buckets = max(1, (max_points - 1) // 2)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    keep = [0]
    for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        if hi > lo:
            keep += [lo + int(np.argmax(values[lo:hi])), hi - 1]
    rows = np.unique(np.asarray(keep, dtype=np.int64))
    return times[rows], values[rows]


def _counter_series(trace: Trace) -> list[tuple[int, str, np.ndarray, np.ndarray]]:
    """(device, track name, times, values) for every counter track with at least one change."""
    ev = trace.events
    signed = trace.signed_bytes()
    series = []
    for d in np.unique(ev["device"]).tolist():
        on_device = (ev["device"] == d) & (signed != 0)
        for category in Category:
            mask = on_device & (ev["category"] == category)
            if mask.any():
                series.append((d, f"{enum_name(category)} bytes", ev["time_us"][mask], np.cumsum(signed[mask])))
        if on_device.any():
            series.append((d, "live bytes", ev["time_us"][on_device], np.cumsum(signed[on_device])))
        action = ev["action"]
        seg = (ev["device"] == d) & ((action == Action.SEGMENT_ALLOC) | (action == Action.SEGMENT_FREE))
        if seg.any():
            delta = np.where(action[seg] == Action.SEGMENT_ALLOC, ev["nbytes"][seg], -ev["nbytes"][seg])
            series.append((d, "reserved bytes", ev["time_us"][seg], np.cumsum(delta)))
    return [(d, name, *_last_per_timestamp(t, v)) for d, name, t, v in series]


def _metadata_event(kind: str, pid: int, name: str, tid: int = 0) -> dict[str, Any]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}


def _span_events(trace: Trace) -> list[dict[str, Any]]:
    sp = trace.spans
    out = []
    for row in range(trace.num_spans):
        kind = SpanKind(int(sp["kind"][row]))
        start, end = int(sp["start_us"][row]), int(sp["end_us"][row])
        name = trace.string(int(sp["name"][row])) or "<unnamed>"
        args: dict[str, Any] = {
            "phase": enum_name(Phase(int(sp["phase"][row]))),
            "modality": enum_name(Modality(int(sp["modality"][row]))),
            "depth": int(sp["depth"][row]),
        }
        if kind == SpanKind.MODULE:
            args["fingerprint"] = trace.string(int(sp["fingerprint"][row]))
            parent = int(sp["parent"][row])
            if 0 <= parent < trace.num_spans:
                args["parent"] = trace.string(int(sp["name"][parent]))
        event = {
            "name": name,
            "cat": enum_name(kind),
            "pid": SPANS_PID,
            "tid": _SPAN_TIDS[kind],
            "ts": start,
            "args": args,
        }
        if kind == SpanKind.MARK and end <= start:
            event.update(ph="i", s="t")
        else:
            event.update(ph="X", dur=max(0, end - start))
        out.append(event)
    return out


def to_chrome(trace: Trace, max_counter_points: int = MAX_COUNTER_POINTS) -> dict[str, Any]:
    """Trace-event JSON (as a dict) with memory counters, module/phase spans and OOM markers."""
    events: list[dict[str, Any]] = [_metadata_event("process_name", SPANS_PID, "memwarden spans")]
    events += [_metadata_event("thread_name", SPANS_PID, _SPAN_THREADS[k], _SPAN_TIDS[k]) for k in SpanKind]
    used_devices = sorted(set(np.unique(trace.events["device"]).tolist()))
    for d in used_devices:
        events.append(_metadata_event("process_name", _DEVICE_PID_BASE + d, f"memory {trace.devices[d]}"))
        events.append({"ph": "M", "name": "process_sort_index", "pid": _DEVICE_PID_BASE + d, "args": {"sort_index": d}})

    series = _counter_series(trace)
    per_series = max(2, max_counter_points // max(1, len(series)))
    for d, name, times, values in series:
        times, values = _thin(times, values, per_series)
        pid = _DEVICE_PID_BASE + d
        events += [
            {"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": t, "args": {"bytes": v}}
            for t, v in zip(times.tolist(), values.tolist(), strict=True)
        ]

    ev = trace.events
    for row in np.flatnonzero(ev["action"] == Action.OOM).tolist():
        events.append(
            {
                "ph": "i",
                "s": "p",
                "name": "OOM",
                "cat": "oom",
                "pid": _DEVICE_PID_BASE + int(ev["device"][row]),
                "tid": 0,
                "ts": int(ev["time_us"][row]),
                "args": {"requested_bytes": int(ev["nbytes"][row]), "op": trace.string(int(ev["op"][row]))},
            }
        )
    events += _span_events(trace)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "memwarden", "devices": list(trace.devices), "metadata": _jsonable(trace.metadata)},
    }


def _jsonable(value: Any) -> Any:
    """Strict JSON (Perfetto rejects NaN): unknown types become strings, NaN/Infinity become "NaN"/"Infinity"."""
    return json.loads(json.dumps(value, default=str), parse_constant=str)


def save_chrome(trace: Trace, path: str | os.PathLike[str], **options: Any) -> Path:
    """Write ``to_chrome(trace)`` as JSON, atomically."""
    data = json.dumps(to_chrome(trace, **options), separators=(",", ":"), allow_nan=False).encode()
    return atomic_write(path, data)
