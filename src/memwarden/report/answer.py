"""The one sentence a report opens with: how high memory went, when, in which phase, the biggest
cause and what to do. Pure: Analysis and findings in, text out (the page escapes it)."""

from __future__ import annotations

import numpy as np

from memwarden.analyze.analysis import Analysis
from memwarden.analyze.diagnose import rank
from memwarden.analyze.finding import Finding
from memwarden.report.findings import allocated, fix_headline
from memwarden.trace.model import Phase, SpanKind, enum_name
from memwarden.units import format_bytes, format_us

__all__ = ["answer_sentence", "phase_at"]

MIN_CAUSE_SHARE = 0.01  # a finding is called the cause of the peak when its fix lowers it by this share


def phase_at(analysis: Analysis, time_us: int) -> str | None:
    """The name of the innermost phase span holding ``time_us`` (times from the trace's start)."""
    trace = analysis.trace
    s = trace.spans
    rows = np.flatnonzero(s["kind"] == SpanKind.PHASE)
    if not len(rows) or not trace.num_events:
        return None
    t = int(trace.events["time_us"][0]) + time_us
    inside = rows[(s["start_us"][rows] <= t) & (t <= s["end_us"][rows])]
    if not len(inside):
        return None
    row = int(inside[np.argmin((s["end_us"] - s["start_us"])[inside])])
    return trace.string(int(s["name"][row])) or enum_name(Phase(int(s["phase"][row])))


def answer_sentence(analysis: Analysis, findings: list[Finding] | None) -> str:
    """E.g. "Peak 197.0 MiB at 37.6 s, in decode 3; weights are 120.0 MiB of it and kv_cache the
    largest of the rest (41.0 MiB). Biggest cause: retained-outputs in model: its fix lowers the peak
    by 30.0 MiB ... Findings are ranked by the peak their fix saves (``diagnose.rank``); one that
    saves only work is never called the cause of the peak."""
    s = analysis.summary
    if not s.events:
        return "No allocations were recorded in this trace, so there is no peak to explain."
    phase = phase_at(analysis, s.peak_time_us)
    text = f"Peak {format_bytes(s.peak_bytes)} at {format_us(s.peak_time_us)}" + (f", in {phase}" if phase else "")
    weights = s.by_category_at_peak.get("weight", 0) + s.by_category_at_peak.get("buffer", 0)
    rest = {k: v for k, v in s.by_category_at_peak.items() if k not in ("weight", "buffer") and v > 0}
    if weights:
        text += f"; weights are {format_bytes(weights)} of it"
    if rest:
        name, value = max(rest.items(), key=lambda kv: kv[1])
        text += f"{' and' if weights else ';'} {name} the largest of the rest ({format_bytes(value)})"
    text += "."
    if findings is None:
        return text
    if not findings:
        return text + " No overflow pattern was found."
    top = min(findings, key=rank)
    if top.saving_peak_bytes < MIN_CAUSE_SHARE * s.peak_bytes:  # wasted work is no cause of the peak
        return (
            f"{text} No finding lowers the peak by 1% or more; {top.pattern} in {top.where} saves "
            f"{format_bytes(top.saving_peak_bytes)} at the peak and {format_bytes(allocated(top))} of allocation "
            f"over the run. Fix: {fix_headline(top.fix)}"
        )
    return (
        f"{text} Biggest cause: {top.pattern} in {top.where}: its fix lowers the peak by "
        f"{format_bytes(top.saving_peak_bytes)} and saves {format_bytes(allocated(top))} of allocation over the "
        f"run. Fix: {fix_headline(top.fix)}"
    )
