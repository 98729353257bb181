"""Findings rendered for the terminal (rich) and as an HTML section. Pure: no I/O."""

from __future__ import annotations

import html
from typing import Any

from rich.console import Group
from rich.text import Text

from memwarden.analyze.diagnose import Finding
from memwarden.units import format_bytes

_STYLE = {"high": "bold red", "medium": "yellow", "low": "dim"}


def _evidence_text(evidence: dict[str, Any], limit: int = 6) -> str:
    parts = []
    for key, value in list(evidence.items())[:limit]:
        if isinstance(value, int) and ("bytes" in key):
            value = format_bytes(value)
        elif isinstance(value, float):
            value = f"{value:.3g}"
        elif isinstance(value, (list, dict)):
            text = str(value)
            value = text if len(text) <= 60 else text[:57] + "..."
        parts.append(f"{key}={value}")
    return ", ".join(parts)


def render_findings(findings: list[Finding], peak_bytes: int) -> Group:
    """One block per finding (reads well in a narrow terminal): headline, where, fix, evidence."""
    if not findings:
        return Group(Text(f"No overflow pattern found (peak {format_bytes(peak_bytes)}).", style="green"))
    parts: list[Text] = [Text(f"Findings (peak {format_bytes(peak_bytes)})", style="bold underline")]
    for i, f in enumerate(findings, 1):
        head = Text.assemble(
            (f"{i}. ", "bold"), (f.severity.upper(), _STYLE.get(f.severity, "")), "  ", (f.pattern, "bold"),
            f"  wastes {format_bytes(f.wasted_bytes)}", f"  ({format_bytes(f.bytes_at_peak)} at peak)",
        )  # fmt: skip
        parts.append(head)
        parts.append(Text.assemble(("   where ", "dim"), f.where))
        parts.append(Text.assemble(("   fix   ", "bold"), f.fix))
        parts.append(Text.assemble(("   evidence ", "dim"), (_evidence_text(f.evidence, limit=8), "dim")))
    return Group(*parts)


def findings_html(findings: list[Finding], peak_bytes: int) -> str:
    """Trusted HTML for the report's findings section (all values escaped)."""
    if not findings:
        return f"<p class='mw-ok'>No overflow pattern found (peak {html.escape(format_bytes(peak_bytes))}).</p>"
    rows = []
    for i, f in enumerate(findings, 1):
        evidence = "".join(
            f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_evidence_text({k: v}).split('=', 1)[1])}</td></tr>"
            for k, v in f.evidence.items()
        )
        rows.append(
            f"<div class='mw-finding mw-{html.escape(f.severity)}' id='finding-{i}'>"
            f"<h3><span class='mw-badge'>{i}</span> {html.escape(f.pattern)} "
            f"<small>{html.escape(f.severity)} · wastes {html.escape(format_bytes(f.wasted_bytes))} · "
            f"{html.escape(format_bytes(f.bytes_at_peak))} at peak</small></h3>"
            f"<p><b>where</b> <code>{html.escape(f.where)}</code></p>"
            f"<p><b>fix</b> {html.escape(f.fix)}</p>"
            f"<details><summary>evidence</summary><table class='mw-evidence'>{evidence}</table></details></div>"
        )
    return "\n".join(rows)


def finding_markers(findings: list[Finding], peak_time_us: int) -> list[dict[str, Any]]:
    """Where each finding sits on the timeline: evidence['time_us'] if the detector gave one, else the peak."""
    markers = []
    for i, f in enumerate(findings, 1):
        t = f.evidence.get("time_us", peak_time_us)
        markers.append({"time_us": int(t) if isinstance(t, (int, float)) else peak_time_us, "label": f"{i}: {f.pattern}",
                        "severity": f.severity, "anchor": f"finding-{i}"})  # fmt: skip
    return markers
