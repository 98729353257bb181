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


PAGE = 8 * MIB  # one rendered page, made in numpy and copied into a PIL image


def _pages(interleaved: bool, copied: bool) -> Trace:
    """40 pages rendered in numpy (each block made, then freed once PIL copied it) from 2 s on,
    the model's calls after them (``pages = render_all(pdf)``): the resident memory outside torch
    rises by the pages' bytes when the copies are kept (``copied``), and stays flat when nothing
    is kept. ``interleaved``: one render before each call (a generator), while the libraries'
    lazy growth adds 48 MiB outside torch over the first requests."""
    b = TraceBuilder()
    b.event(1_000_000, Action.ALLOC, 0, 0x1000, 4 * MIB, category=Category.WEIGHT)
    t, steps, tensor = 2_000_000, [], 1
    for _ in range(40):
        for action in (Action.ALLOC, Action.FREE):
            b.event(t, action, tensor, 0x10000000, PAGE, op="(numpy)", line="render.py:12:render_page")
            t += 40_000
        tensor += 1
        if interleaved:
            steps.append(
                Step(phase="prefill", start_us=t, end_us=t + 20_000, module="Pix2StructForConditionalGeneration")
            )
            t += 40_000
    if not interleaved:
        for _ in range(40):
            steps.append(
                Step(phase="prefill", start_us=t, end_us=t + 20_000, module="Pix2StructForConditionalGeneration")
            )
            t += 40_000
    for s in steps:
        b.event(s.start_us + 1, Action.ALLOC, tensor, 0x900000, MIB, category=Category.ACTIVATION)
        b.event(s.start_us + 9, Action.FREE, tensor, 0x900000, MIB, category=Category.ACTIVATION)
        tensor += 1
    b.event(t + 10, Action.FREE, 0, 0x1000, 4 * MIB, category=Category.WEIGHT)
    trace = b.build()
    times = list(range(0, t + 100_000, 100_000))
    # before each time: how many pages were rendered (their copies held until the end when ``copied``)
    rendered = [min(40, max(0, (x - 2_000_000) // (80_000 if not interleaved else 120_000))) for x in times]
    traced = [4 * MIB + (PAGE if 0 < r else 0) for r in rendered]
    if interleaved:  # the libraries' lazy growth over the first requests, then flat
        kept = [min(48 * MIB, max(0, x - 2_000_000) * 48 * MIB // 2_000_000) for x in times]
    else:
        kept = [r * PAGE if copied else 0 for r in rendered]
    rss = [300 * MIB + tr + k for tr, k in zip(traced, kept, strict=True)]
    samples = {
        "time_us": times,
        "rss": rss,
        "traced": traced,
        "not_traced": [r - x for r, x in zip(rss, traced, strict=True)],
    }
    metadata = {**trace.metadata, "steps": steps_metadata(steps)}
    metadata["resident"] = {"interval_ms": 100, "samples": samples, "last_bytes": rss[-1], "peak_bytes": max(rss)}
    return Trace(trace.events, trace.spans, trace.strings, trace.shapes, trace.devices, metadata)


def test_data_copied_out_of_numpy_before_the_first_call_is_named_at_its_line() -> None:
    """Pages rendered whole before the model's first call, each through numpy into a PIL image the
    script keeps: the rise outside torch is as large as the numpy blocks, which tells data from the
    imports that the baseline before the first call otherwise absorbs."""
    (f,) = [f for f in diagnose(_pages(interleaved=False, copied=True)) if f.pattern == "untracked-host-memory"]
    assert f.severity == "high" and f.evidence["numpy_blocks"] == 40
    assert f.evidence["not_traced_held_at_rss_peak_bytes"] >= 35 * PAGE
    assert f.lines[-1]["file"] == "render.py" and f.lines[-1]["line"] == 12


def test_pages_rendered_one_per_call_or_not_kept_are_no_finding() -> None:
    # a generator: one page per request; the growth beside them is not their copies
    assert _untracked(_pages(interleaved=True, copied=True)) == []
    # rendered whole, each page dropped after use: nothing rose outside torch
    assert _untracked(_pages(interleaved=False, copied=False)) == []
