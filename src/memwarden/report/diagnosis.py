"""The HTML report with a findings section and the findings marked on the timeline."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from memwarden.analyze.diagnose import Finding
from memwarden.analyze.timeline import summary
from memwarden.report.findings import finding_markers, findings_html
from memwarden.report.html import Section, write_html
from memwarden.trace.model import Trace


def diagnosis_sections(trace: Trace, findings: list[Finding]) -> tuple[list[Section], list[dict[str, Any]]]:
    s = summary(trace)
    return [Section("Findings", findings_html(findings, s.peak_bytes))], finding_markers(findings, s.peak_time_us)


def write_diagnosis_html(trace: Trace, findings: list[Finding], path: str | os.PathLike[str], **kwargs: Any) -> Path:
    sections, markers = diagnosis_sections(trace, findings)
    extra = list(kwargs.pop("extra_sections", ())) + sections
    return write_html(trace, path, extra_sections=extra, markers=markers, **kwargs)
