"""Resident memory outside torch, judged on the trace's own clock.

``memwarden trace`` starts recording before the script imports anything, so the trace's first
event comes seconds after the clock's zero (the interpreter importing torch and transformers), and
the resident samples (``metadata.resident``) are on that same clock. Memory held outside torch
until the model's first call returns (libraries, a model being built, data read up front) is the
baseline of ``untracked-host-memory``, however late the first event comes; what grows after it is
the finding. A trace built here with the shape of a ``memwarden trace`` run: imports for 9 s, then
data rising outside torch to 900 MiB by 15 s.
"""

from __future__ import annotations

from memwarden.analyze.diagnose import diagnose
from memwarden.trace.model import Action, Category, Trace, TraceBuilder
from memwarden.trace.steps import Step, steps_metadata

MIB = 1 << 20
FIRST_EVENT_US = 9_000_000  # the script's first tensor, after its imports


def _run(call_start_us: int) -> Trace:
    b = TraceBuilder()
    b.event(FIRST_EVENT_US, Action.ALLOC, 0, 0x1000, 4 * MIB, category=Category.WEIGHT)
    b.event(call_start_us + 10, Action.ALLOC, 1, 0x900000, MIB, category=Category.ACTIVATION)
    b.event(call_start_us + 90, Action.FREE, 1, 0x900000, MIB, category=Category.ACTIVATION)
    b.event(15_000_000, Action.FREE, 0, 0x1000, 4 * MIB, category=Category.WEIGHT)
    trace = b.build()
    step = Step(
        phase="prefill", start_us=call_start_us, end_us=call_start_us + 100, module="LlavaForConditionalGeneration"
    )
    times = list(range(0, 15_000_001, 100_000))
    rss = [100 * MIB + max(0, t - FIRST_EVENT_US) * 800 * MIB // 6_000_000 for t in times]
    traced = [4 * MIB if FIRST_EVENT_US <= t < 15_000_000 else 0 for t in times]
    samples = {
        "time_us": times,
        "rss": rss,
        "traced": traced,
        "not_traced": [r - t for r, t in zip(rss, traced, strict=True)],
    }
    metadata = {**trace.metadata, "steps": steps_metadata([step])}
    metadata["resident"] = {"interval_ms": 100, "samples": samples, "last_bytes": rss[-1], "peak_bytes": max(rss)}
    return Trace(trace.events, trace.spans, trace.strings, trace.shapes, trace.devices, metadata)


def _untracked(trace: Trace) -> list[str]:
    return [f.severity for f in diagnose(trace) if f.pattern == "untracked-host-memory"]


def test_growth_before_the_only_model_call_is_the_baseline_however_late_the_first_event() -> None:
    # the model's only call comes at the end: everything held outside torch was there before it
    assert _untracked(_run(call_start_us=14_900_000)) == []


def test_growth_after_the_first_call_is_named() -> None:
    # the same growth, after a call at 9.5 s: data kept per request, rising to the end
    assert _untracked(_run(call_start_us=9_500_000)) == ["high"]
