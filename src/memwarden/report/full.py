"""The full HTML report: summary, findings marked on the timeline, and the simulated
caching-allocator heatmap. Used by `memwarden report` and `memwarden demo`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from memwarden.trace.model import Action, Trace

# Replaying a very long trace for the picture alone is not worth minutes of waiting.
HEATMAP_MAX_EVENTS = 2_000_000


def heatmap_for(trace: Trace, device: int | None = None) -> bytes | None:
    """PNG of the trace replayed through the PyTorch caching-allocator model, or None if nothing to draw."""
    from memwarden.analyze.timeline import primary_device
    from memwarden.plan.replay import replay
    from memwarden.report.heatmap import heatmap_png_bytes

    dev = primary_device(trace) if device is None else device
    allocs = (trace.events["action"] == Action.ALLOC) & (trace.events["device"] == dev)
    if not allocs.any() or trace.num_events > HEATMAP_MAX_EVENTS:
        return None
    result = replay(trace, device=dev, history_columns=400)
    return heatmap_png_bytes(result, title="Simulated PyTorch caching allocator (default settings)")


def write_report(
    trace: Trace,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    findings: list[Any] | None = None,
    diagnose_trace: bool = True,
    heatmap: bool = True,
) -> Path:
    from memwarden.report.diagnosis import diagnosis_sections
    from memwarden.report.html import write_html

    if findings is None and diagnose_trace:
        from memwarden.analyze.diagnose import diagnose

        findings = diagnose(trace)
    sections, markers = diagnosis_sections(trace, findings) if findings is not None else ([], [])
    markers = list(markers) + [  # governor decisions and budget changes noted during the capture
        {"time_us": a.get("time_us", 0), "label": f"{a.get('kind', '')}: {a.get('label', '')}", "severity": "info"}
        for a in trace.metadata.get("annotations", []) if isinstance(a, dict)
    ]  # fmt: skip
    png = heatmap_for(trace) if heatmap else None
    return write_html(trace, path, title=title, extra_sections=sections, markers=markers, heatmap_png=png)
