"""The one HTML report of a trace: summary, findings marked on the timeline, and the simulated
caching-allocator heatmap. `memwarden report`, `memwarden diagnose --html` and `memwarden demo`
all write it with ``write_report``, so the same trace gives the same page from each."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.analyze.analysis import Analysis
from memwarden.analyze.diagnose import diagnose
from memwarden.analyze.finding import Finding
from memwarden.analyze.lines import allocated_by_line
from memwarden.analyze.timeline import live_blocks_at
from memwarden.report.answer import answer_sentence
from memwarden.report.findings import finding_markers, findings_html
from memwarden.report.flame import flame_svg, flame_tree
from memwarden.report.html import Section, write_html
from memwarden.report.source_view import read_source_lines, source_view_html
from memwarden.trace.model import Action, Trace

__all__ = ["HEATMAP_COLUMNS", "HEATMAP_MAX_EVENTS", "diagnose_report", "heatmap_for", "write_report"]

# Replaying a very long trace for the picture alone is not worth minutes of waiting.
HEATMAP_MAX_EVENTS = 2_000_000
HEATMAP_COLUMNS = 400  # layout columns recorded by the replay the heatmap draws


def heatmap_for(analysis: Analysis) -> bytes | None:
    """PNG of the trace replayed through the PyTorch caching-allocator model, or None if nothing to draw."""
    from memwarden.report.heatmap import heatmap_png_bytes  # matplotlib: only when a heatmap is drawn

    trace = analysis.trace
    allocs = (trace.events["action"] == Action.ALLOC) & (trace.events["device"] == analysis.device)
    if not allocs.any() or trace.num_events > HEATMAP_MAX_EVENTS:
        return None
    result = analysis.replay(history_columns=HEATMAP_COLUMNS)
    times_s = (trace.events["time_us"] - trace.events["time_us"][0]) / 1e6  # the timeline's zero and unit
    return heatmap_png_bytes(result, title="Simulated PyTorch caching allocator (default settings)", times_s=times_s)


def _findings_section(analysis: Analysis, findings: list[Finding]) -> tuple[Section, list[dict[str, Any]]]:
    s = analysis.summary
    markers = finding_markers(findings, s.peak_time_us, analysis.trace)
    return Section("Findings", findings_html(findings, s.peak_bytes)), markers


def _source_section(analysis: Analysis) -> Section | None:
    """The user's lines at the peak with their source text (read here, at the edge), or None when
    no block carries a line (a trace recorded without lines, an estimate)."""
    top = analysis.summary.top_lines_at_peak
    if not top:
        return None
    source = read_source_lines((x.file, x.line) for x in top)
    return Section("Source lines at peak", source_view_html(top, allocated_by_line(analysis.trace), source))


def _flame_section(analysis: Analysis) -> Section | None:
    """The bytes at the peak from the user's lines down to module and op, or None when empty."""
    trace = analysis.trace
    if not trace.num_events:
        return None
    peak = int(np.argmax(analysis.live_bytes))
    root = flame_tree(trace, live_blocks_at(trace, peak, analysis.device, analysis.free_index))
    return Section("Flame graph at peak", flame_svg(root)) if root.nbytes > 0 else None


def _annotation_markers(trace: Trace) -> list[dict[str, Any]]:
    """Governor decisions and budget changes noted during the capture."""
    markers = []
    for a in trace.metadata.get("annotations", []):
        if not isinstance(a, dict):
            continue
        kind, label = str(a.get("kind", "")), str(a.get("label", ""))
        text = label if not kind or label.startswith(kind) else f"{kind}: {label}"  # never "admit: admit: ..."
        markers.append({"time_us": a.get("time_us", 0), "label": text, "severity": "info"})
    return markers


def diagnose_report(
    trace: Trace,
    html: str | os.PathLike[str] | None = None,
    *,
    thresholds: dict[str, dict[str, Any]] | None = None,
    patterns: list[str] | None = None,
    budget_bytes: int | None = None,
) -> tuple[Analysis, list[Finding]]:
    """``diagnose``, and with ``html`` the report beside it, from one Analysis (with a report, the
    detectors' allocator replay records the heatmap's layout too: one replay for both)."""
    analysis = Analysis(trace, replay_history_columns=HEATMAP_COLUMNS if html is not None else 0)
    findings = diagnose(analysis, thresholds, patterns, budget_bytes=budget_bytes)
    if html is not None:
        write_report(analysis, html, findings=findings)
    return analysis, findings


def write_report(
    trace: Trace | Analysis,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    findings: list[Finding] | None = None,
    diagnose_trace: bool = True,
    heatmap: bool = True,
    analysis: Analysis | None = None,
) -> Path:
    """Write the report of ``trace`` (a Trace, or its Analysis when the caller already has one:
    ``analysis=`` says the same) to ``path`` (atomically) and return the path.

    ``findings``: already diagnosed (with the caller's thresholds or patterns); else the trace is
    diagnosed here unless ``diagnose_trace`` is false (then the page has no findings section).
    """
    if isinstance(trace, Analysis):
        analysis = trace
        trace = analysis.trace
    if analysis is None:  # replays record the heatmap's layout: the detectors' replay is the picture's
        analysis = Analysis(trace, replay_history_columns=HEATMAP_COLUMNS if heatmap else 0)
    # The heatmap first: a replay with layout history answers the fragmentation detector's too.
    png = heatmap_for(analysis) if heatmap else None
    if findings is None and diagnose_trace:
        findings = diagnose(trace, analysis=analysis)
    sections: list[Section] = []
    markers: list[dict[str, Any]] = []
    if findings is not None:
        section, markers = _findings_section(analysis, findings)
        sections.append(section)
    markers += _annotation_markers(trace)
    extra = [s for s in (_source_section(analysis), _flame_section(analysis)) if s is not None]
    return write_html(
        trace,
        path,
        title=title,
        lead_sections=sections,
        markers=markers,
        heatmap_png=png,
        analysis=analysis,
        answer=answer_sentence(analysis, findings),
        extra_sections=extra,
    )
