"""Findings rendered for the terminal (rich) and as an HTML section. Pure: no I/O."""

from __future__ import annotations

import html
from typing import Any

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from memwarden.analyze.finding import Finding
from memwarden.trace.model import SpanKind, Trace
from memwarden.units import format_bytes, format_us

_STYLE = {"high": "bold red", "medium": "yellow", "low": "dim"}


FIX_CHARS = 200  # about three 80-column lines; the full text is one `diagnose --json` (or a click) away
EVIDENCE_ROWS = 8


def headline(f: Finding) -> str:
    """Both numbers of the fix's counterfactual: how much lower the peak would be, and the
    allocation over the run it saves."""
    return f"the fix saves {format_bytes(peak_added(f))} at the peak and {format_bytes(allocated(f))} of allocation"


def fix_at(f: Finding) -> str:
    """The line to change, ``file:line``: the first of the finding's lines (its JSON ``lines[0]``)."""
    if not f.lines:
        return ""
    first = f.lines[0]
    return f"{first.get('file')}:{first.get('line')}"


def peak_added(f: Finding) -> int:
    return max(0, f.saving_peak_bytes)


def allocated(f: Finding) -> int:
    return max(0, f.saving_allocated_bytes)


def short_fix(text: str, limit: int = FIX_CHARS) -> str:
    """The fix's first sentence (the change to make), cut at a word within ``limit`` characters."""
    text = " ".join(text.split())
    for mark in (". ", "; "):
        head, sep, _ = text.partition(mark)
        if sep and len(head) < limit:
            text = head.rstrip(".") + "."
            break
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0]
    return cut.rstrip(",;:(") + " …"


def _label(key: str) -> str:
    return key.replace("_", " ")


def _value(key: str, value: Any, width: int = 60) -> str:
    """One evidence value as a person reads it: bytes in KiB/MiB, lists as counts and names."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and "bytes" in key:
        return format_bytes(value)
    if isinstance(value, int) and key.endswith("_us"):
        return format_us(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        text = ", ".join(f"{k}: {_value(k, v, 20)}" for k, v in value.items())
    elif isinstance(value, list):
        names = [_item_name(v) for v in value]
        shown = ", ".join(names[:3]) + (f", … ({len(value)} in all)" if len(value) > 3 else "")
        text = shown if all(isinstance(v, dict) for v in value) is False or not value else f"{len(value)}: {shown}"
    else:
        text = str(value)
    return text if len(text) <= width else text[: width - 2] + " …"


def _item_name(item: Any) -> str:
    if isinstance(item, dict):
        for key in ("module", "op", "name", "step"):
            if key in item:
                count = item.get("encodes") or item.get("copies") or item.get("blocks")
                return f"{item[key]}" + (f" ×{count}" if isinstance(count, int) else "")
        return ", ".join(f"{k}={v}" for k, v in list(item.items())[:2])
    if isinstance(item, list):
        return "x".join(str(v) for v in item)
    return str(item)


def evidence_rows(evidence: dict[str, Any], limit: int = EVIDENCE_ROWS) -> list[tuple[str, str]]:
    """The evidence as (label, value) rows: the first ``limit`` facts the detector recorded."""
    return [(_label(k), _value(k, v)) for k, v in list(evidence.items())[:limit]]


def render_findings(findings: list[Finding], peak_bytes: int) -> Group:
    """One block per finding, readable in five seconds in an 80-column terminal: headline with
    both numbers named, where, the fix in at most three lines, then the evidence as a table."""
    if not findings:
        return Group(Text(f"No overflow pattern found (peak {format_bytes(peak_bytes)}).", style="green"))
    parts: list[object] = [Text(f"Findings (peak {format_bytes(peak_bytes)})", style="bold underline")]
    for i, f in enumerate(findings, 1):
        parts.append(
            Text.assemble(
                (f"{i}. ", "bold"),
                (f.severity.upper(), _STYLE.get(f.severity, "")),
                " ",
                (f.pattern, "bold"),
                (" in ", "dim"),
                f.where,
            )
        )
        parts.append(Text("   " + headline(f)))
        fix = Table.grid(padding=(0, 1))
        fix.add_column(style="bold", no_wrap=True)
        fix.add_column()
        fix.add_row("   fix", short_fix(f.fix))
        if at := fix_at(f):
            fix.add_row("   at", at)
        parts.append(fix)
        rows = evidence_rows(f.evidence)
        if rows:
            parts.append(Text("   evidence", style="dim"))
            grid = Table.grid(padding=(0, 2))
            grid.add_column(style="dim", no_wrap=True)
            grid.add_column(style="dim", overflow="fold")
            for label, value in rows:
                grid.add_row("     " + label, value)
            parts.append(grid)
    parts.append(Text("Full fixes and evidence: memwarden diagnose FILE --json, or the HTML report.", style="dim"))
    return Group(*parts)  # type: ignore[arg-type]


def findings_html(findings: list[Finding], peak_bytes: int) -> str:
    """Trusted HTML for the report's findings section (all values escaped): headline and short
    fix visible, the full fix and the evidence table collapsed; a link to the evidence on the
    timeline."""
    if not findings:
        return f"<p class='mw-ok'>No overflow pattern found (peak {html.escape(format_bytes(peak_bytes))}).</p>"
    esc = html.escape
    rows = []
    for i, f in enumerate(findings, 1):
        evidence = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in evidence_rows(f.evidence, 99))
        rows.append(
            f"<div class='mw-finding mw-{esc(f.severity)}' id='finding-{i}'>"
            f"<h3><span class='mw-badge'>{i}</span> {esc(f.pattern)} <small>{esc(f.severity)} · "
            f"in <code>{esc(f.where)}</code></small></h3>"
            f"<p class='mw-headline'>{esc(headline(f))}</p>"
            f"<p><b>fix</b> {esc(short_fix(f.fix))}</p>"
            + (f"<p class='mw-fix-at'><b>fix at</b> <code>{esc(fix_at(f))}</code></p>" if fix_at(f) else "")
            + f"<p><a class='mw-goto' href='#timeline' data-finding='{i}'>show the evidence on the timeline</a></p>"
            f"<details><summary>full fix and evidence</summary><p>{esc(f.fix)}</p>"
            f"<table class='mw-evidence'>{evidence}</table></details></div>"
        )
    return "\n".join(rows)


def finding_markers(findings: list[Finding], peak_time_us: int, trace: Trace | None = None) -> list[dict[str, Any]]:
    """Where each finding's evidence sits on the timeline (times from the trace's start): the
    repeated encodes a kv-reprefill counted, where they ran; ``evidence['time_us']`` when a
    detector gave one; else the peak. Each marker links to its finding (``anchor``)."""
    markers = []
    for i, f in enumerate(findings, 1):
        base = {"severity": f.severity, "anchor": f"finding-{i}", "finding": i}
        places = _evidence_places(f, trace) if trace is not None else []
        if places:
            markers += [
                {**base, "time_us": t, "label": f"{i}: {f.pattern} · {short}", "detail": detail}
                for t, short, detail in places
            ]
            continue
        t = f.evidence.get("time_us", peak_time_us)
        t = int(t) if isinstance(t, (int, float)) else peak_time_us
        where = "at the peak" if t == peak_time_us else "here"
        markers.append({**base, "time_us": t, "label": f"{i}: {f.pattern} · {where}"})
    return markers


def _evidence_places(f: Finding, trace: Trace) -> list[tuple[int, str, str]]:
    """(time from the trace's start, short label, detail) for evidence that names module calls:
    one place per repeated encode (calls of several modules on the same input at one moment, a
    tower and its projector, count once)."""
    encodes = f.evidence.get("encodes")
    if not isinstance(encodes, list) or not trace.num_events:
        return []
    times = trace.events["time_us"]
    t0 = int(times[0])
    close_us = max(1, int(times[-1] - t0) // 10)  # a tenth of the run: the same encode, seen by another module
    s = trace.spans
    modules = s["kind"] == SpanKind.MODULE
    index = {text: k for k, text in enumerate(trace.strings)}
    places: list[tuple[int, str, str]] = []
    seen: list[tuple[int, int]] = []  # (repeat number, time) already placed
    for item in encodes:
        if not isinstance(item, dict):
            continue
        name, fp = index.get(str(item.get("module"))), index.get(str(item.get("fingerprint")))
        if name is None or fp is None:
            continue
        rows = np.flatnonzero(modules & (s["name"] == name) & (s["fingerprint"] == fp))
        starts = sorted(set((s["start_us"][rows] - t0).tolist()))
        for k, t in enumerate(starts[1:], 2):  # the first encode was needed; the repeats are the waste
            if any(k == j and abs(t - kept) <= close_us for j, kept in seen):
                continue
            seen.append((k, int(t)))
            places.append((int(t), f"encode {k}/{len(starts)}", f"{item.get('module')} encoded the same input again"))
    return sorted(places)


def fix_headline(text: str) -> str:
    """The fix's lead clause (``Keep the KV cache between turns``), for one-sentence summaries."""
    text = " ".join(text.split())
    text = text[:1].upper() + text[1:]
    cut = min((i for i in (text.find(": "), text.find("; "), text.find(" (")) if i >= 12), default=-1)
    return text[:cut].rstrip(".,") + "." if 0 < cut <= 120 else short_fix(text, 120)
