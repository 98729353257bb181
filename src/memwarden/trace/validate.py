"""Validation of a loaded trace: every value a command relies on is checked once, at load.

``trace.format.loads`` calls :func:`check_trace` on every file it reads, so analyses, replays and
reports index, add and compare without checks of their own: a hostile or corrupt file is one
``TraceFormatError`` naming the reason, never a traceback three commands later. The bounds:

- index columns inside their tables; enum columns (events and spans) inside their enums;
- event times sorted (every writer sorts them) and within ±2**53 µs (so differences never overflow);
- sizes: ``nbytes`` 0..2**48 (256 TiB) per event and 2**62 in all, ``written_bytes`` -1..2**48;
- shapes: dimensions 0..2**40, at most 64 of them, elements in all at most 2**62;
- spans: ``parent`` -1 or another span's row, with no cycle; ``depth`` 0..number of spans; times in
  the same range as the events, ``end_us >= start_us``;
- metadata: the keys commands read have their types (``annotations`` a list of objects with numeric
  ``time_us``/``budget_bytes``, strings where strings are printed); non-finite numbers never get
  this far (the header's JSON refuses ``Infinity``/``NaN``). ``steps`` are read through
  ``trace.steps.steps_of``, which skips malformed entries.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from memwarden.trace.model import Action, Category, Modality, Phase, SpanKind, Trace, TraceFormatError

MAX_TIME_US = 2**53  # ±285 years of microseconds: differences and sums stay exact in int64 and float64
MAX_EVENT_BYTES = 2**48  # 256 TiB in one allocation
MAX_TOTAL_BYTES = 2**62
MAX_DIM = 2**40
MAX_RANK = 64

__all__ = ["MAX_EVENT_BYTES", "MAX_TIME_US", "check_trace"]


def _bad(what: str) -> TraceFormatError:
    return TraceFormatError(f"trace is corrupt ({what})")


def check_trace(trace: Trace) -> None:
    """Raise ``TraceFormatError`` for the first value of ``trace`` a command could not rely on."""
    _check_indices(trace)
    _check_events(trace)
    _check_shapes(trace)
    _check_spans(trace)
    _check_metadata(trace.metadata)


def _check_indices(trace: Trace) -> None:
    n_strings, n_shapes, n_devices = len(trace.strings), len(trace.shapes), len(trace.devices)
    ev, sp = trace.events, trace.spans
    checks = [
        (ev["module"], n_strings, "module"),
        (ev["op"], n_strings, "op"),
        (ev["dtype"], n_strings, "dtype"),
        (ev["line"], n_strings, "line"),
        (ev["stack"], n_strings, "stack"),
        (ev["shape"], n_shapes, "shape"),
        (ev["device"], n_devices, "device"),
        (sp["name"], n_strings, "span name"),
        (sp["fingerprint"], n_strings, "span fingerprint"),
    ]
    for column, limit, what in checks:
        if len(column) and (int(column.min()) < -1 or int(column.max()) >= limit):
            raise _bad(f"{what} index out of range")
    if len(ev["device"]) and int(ev["device"].min()) < 0:
        raise _bad("device index out of range")
    if len(sp["name"]) and int(sp["name"].min()) < 0:
        raise _bad("span name index out of range")
    enum_checks = [
        (ev["action"], len(Action), "action"),
        (ev["category"], len(Category), "category"),
        (ev["modality"], len(Modality), "modality"),
        (ev["phase"], len(Phase), "phase"),
        (sp["kind"], len(SpanKind), "span kind"),
        (sp["modality"], len(Modality), "span modality"),
        (sp["phase"], len(Phase), "span phase"),
    ]
    for column, limit, what in enum_checks:
        if len(column) and int(column.max()) >= limit:
            raise _bad(f"{what} value out of range")


def _check_events(trace: Trace) -> None:
    ev = trace.events
    times = ev["time_us"]
    if len(times):
        if int(times.min()) < -MAX_TIME_US or int(times.max()) > MAX_TIME_US:
            raise _bad(f"event time outside ±{MAX_TIME_US} µs")
        if bool((np.diff(times) < 0).any()):
            raise _bad("event times are not sorted")
    nbytes = ev["nbytes"]
    if len(nbytes):
        if int(nbytes.min()) < 0:
            raise _bad("negative event size")
        if int(nbytes.max()) > MAX_EVENT_BYTES:
            raise _bad(f"event size above {MAX_EVENT_BYTES} bytes")
        if float(nbytes.sum(dtype=np.float64)) > MAX_TOTAL_BYTES:
            raise _bad(f"event sizes add up to more than {MAX_TOTAL_BYTES} bytes")
    written = ev["written_bytes"]
    if len(written) and (int(written.min()) < -1 or int(written.max()) > MAX_EVENT_BYTES):
        raise _bad("written_bytes out of range")


def _check_shapes(trace: Trace) -> None:
    for shape in trace.shapes:
        if len(shape) > MAX_RANK:
            raise _bad(f"a shape of {len(shape)} dimensions")
        elements = 1
        for d in shape:
            if not 0 <= d <= MAX_DIM:
                raise _bad(f"shape dimension {d} outside 0..{MAX_DIM}")
            elements *= d
        if elements > MAX_TOTAL_BYTES:
            raise _bad(f"a shape of more than {MAX_TOTAL_BYTES} elements")


def _check_spans(trace: Trace) -> None:
    sp = trace.spans
    n = len(sp["parent"])
    if not n:
        return
    start, end = sp["start_us"], sp["end_us"]
    if min(int(start.min()), int(end.min())) < -MAX_TIME_US or max(int(start.max()), int(end.max())) > MAX_TIME_US:
        raise _bad(f"span time outside ±{MAX_TIME_US} µs")
    if bool((end < start).any()):
        raise _bad("a span ends before it starts")
    parent = sp["parent"].astype(np.int64)
    if int(parent.min()) < -1 or int(parent.max()) >= n:
        raise _bad("span parent out of range")
    depth = sp["depth"]
    if int(depth.min()) < 0 or int(depth.max()) > n:
        raise _bad("span depth out of range")
    # No cycle: the 2**k-th ancestor, by doubling, is -1 everywhere once 2**k exceeds the deepest chain.
    ancestor = parent
    for _ in range(max(1, math.ceil(math.log2(n + 1))) + 1):
        ancestor = np.where(ancestor >= 0, ancestor[np.clip(ancestor, 0, None)], -1)
    if bool((ancestor >= 0).any()):
        raise _bad("span parents form a cycle")


def _number(value: Any, lo: float, hi: float) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value) and lo <= value <= hi


def _check_metadata(metadata: dict[str, Any]) -> None:
    for key in ("capture", "device", "model", "model_name", "torch_version", "source"):
        if key in metadata and metadata[key] is not None and not isinstance(metadata[key], str):
            raise _bad(f"metadata.{key} must be a string, not {type(metadata[key]).__name__}")
    for key in ("duration_us", "started_at"):
        value = metadata.get(key)
        if value is not None and not isinstance(value, str) and not _number(value, -MAX_TIME_US, MAX_TIME_US):
            raise _bad(f"metadata.{key} is not a finite number in range")
    annotations = metadata.get("annotations")
    if "annotations" in metadata:  # null too: readers take .get("annotations", []) as the list
        if not isinstance(annotations, list):
            raise _bad(f"metadata.annotations must be a list, not {type(annotations).__name__}")
        for i, a in enumerate(annotations):
            if not isinstance(a, dict):
                raise _bad(f"metadata.annotations[{i}] is not an object")
            if "time_us" in a and not _number(a["time_us"], -MAX_TIME_US, MAX_TIME_US):
                raise _bad(f"metadata.annotations[{i}].time_us is not a time in range")
            if "budget_bytes" in a and not _number(a["budget_bytes"], 0, MAX_TOTAL_BYTES):
                raise _bad(f"metadata.annotations[{i}].budget_bytes is not a size in range")
            for text in ("kind", "label"):
                if text in a and not isinstance(a[text], str):
                    raise _bad(f"metadata.annotations[{i}].{text} must be a string")
    ooms = metadata.get("ooms")
    if ooms is not None and (not isinstance(ooms, list) or not all(isinstance(o, dict) for o in ooms)):
        raise _bad("metadata.ooms must be a list of objects")
    for i, oom in enumerate(ooms or []):
        for key in ("requested_bytes", "device_free_bytes", "time_us"):
            bound = MAX_TIME_US if key == "time_us" else MAX_TOTAL_BYTES
            if key in oom and not _number(oom[key], -bound if key == "time_us" else 0, bound):
                raise _bad(f"metadata.ooms[{i}].{key} is not a number in range")
