"""A self-contained HTML report of a Trace: one file, every asset inline.

``render_html`` is pure (Trace, or its shared ``Analysis``, in; string out); ``write_html`` is the
only I/O. The page works air-gapped: the plotting script ships in ``report/assets`` and the
house stylesheet beside ``html_page.py`` (shared with the stress page), both inlined; images are data: URIs, and a
Content-Security-Policy forbids every fetch (``default-src 'none'``) and lets
only our own script run (pinned by its sha256), so a report cannot phone home
and a string from a trace cannot run as code even if escaping failed.

Trace strings (module paths, metadata) reach the page two ways, each escaped
for its context: HTML-escaped in tables, and inside the JSON data block with
``<``, ``>``, ``&`` written as ``\\u003c`` etc., so ``</script>`` in a module
name cannot end the block. The script only ever puts them in ``textContent``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.analyze.analysis import Analysis
from memwarden.analyze.timeline import Summary
from memwarden.html_page import escape, report_page
from memwarden.report.html_tables import PALETTE, breakdowns, heaviest_modules, sites
from memwarden.report.resident import resident_section_html
from memwarden.trace.model import Modality, Phase, SpanKind, Trace, enum_name
from memwarden.units import format_bytes, format_us

__all__ = ["Section", "render_html", "write_html"]

TIMELINE_MAX_POINTS = 2000  # per stacking; the peak survives downsampling (see analyze.timeline)
MAX_LANE_SPANS = 4000  # longest module calls drawn in the lane view; the rest only count in the table
MAX_LANE_DEPTH = 12  # deeper module calls are too thin to read next to a whole run
MAX_PHASE_SPANS = 500

# Metadata keys that different capture paths use for the same header field, first match wins.
_HEADER_FIELDS: list[tuple[str, tuple[str, ...]]] = [
    ("Model", ("model", "model_name", "model_id")),
    ("Device", ("device_name", "device")),
    ("Capture", ("capture_method", "capture", "method", "source")),
    ("Torch", ("torch_version", "torch")),
    ("When", ("created_at", "captured_at", "when", "timestamp", "started_at", "date", "time")),
]


@dataclass(frozen=True)
class Section:
    """An extra report section. ``html`` is trusted markup made by memwarden itself, inserted as is."""

    title: str
    html: str


# -- formatting -------------------------------------------------------------------


def _json_for_script(payload: Any) -> str:
    """JSON that cannot close or comment out the <script> element it sits in."""
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    # <, > and & only occur inside JSON strings, where \\uXXXX escapes mean the same characters.
    for raw, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, escaped)
    return text


def _slug(title: str, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "section"
    slug, k = base, 2
    while slug in taken:
        slug, k = f"{base}-{k}", k + 1
    taken.add(slug)
    return slug


def _meta_text(key: str, value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and key in _HEADER_FIELDS[-1][1] and value > 1e9:
        return _dt.datetime.fromtimestamp(float(value), tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    if isinstance(value, (dict, list)):
        text = json.dumps(value, default=str)
    else:
        text = str(value)
    return text if len(text) <= 300 else text[:297] + "…"


# -- data for the script -------------------------------------------------------


def _time_origin_us(trace: Trace) -> int:
    """The zero of every time axis: the first event, as analyze.timeline uses."""
    if trace.num_events:
        return int(trace.events["time_us"][0])
    if trace.num_spans:
        return int(trace.spans["start_us"].min())
    return 0


def _timeline_payload(analysis: Analysis, by: str) -> dict[str, Any]:
    tl = analysis.timeline(by, max_points=TIMELINE_MAX_POINTS)
    return {
        "time_us": tl.time_us.tolist(),
        "total": tl.total.tolist(),
        "series": [{"name": name, "values": values.tolist()} for name, values in tl.series.items()],
    }


def _lane_payload(trace: Trace, t0_us: int) -> dict[str, Any]:
    """Module calls (longest first when capped) and phase spans as parallel arrays, times from t0."""
    s = trace.spans
    kind = s["kind"]
    module_rows = np.flatnonzero(kind == SpanKind.MODULE)
    depth = s["depth"]
    in_depth = module_rows[depth[module_rows] < MAX_LANE_DEPTH]
    duration = s["end_us"] - s["start_us"]
    if len(in_depth) > MAX_LANE_SPANS:
        keep = np.argsort(-duration[in_depth], kind="stable")[:MAX_LANE_SPANS]
        rows = np.sort(in_depth[keep])
    else:
        rows = in_depth
    names: list[str] = []
    name_ids: dict[int, int] = {}

    def local(index: int) -> int:
        if index < 0:
            return -1
        if index not in name_ids:
            name_ids[index] = len(names)
            names.append(trace.strings[index])
        return name_ids[index]

    modules = {
        "start": (s["start_us"][rows] - t0_us).tolist(),
        "end": (s["end_us"][rows] - t0_us).tolist(),
        "depth": depth[rows].tolist(),
        "name": [local(int(i)) for i in s["name"][rows]],
        "fp": [local(int(i)) for i in s["fingerprint"][rows]],
        "modality": [enum_name(Modality(int(m))) for m in s["modality"][rows]],
        "phase": [enum_name(Phase(int(p))) for p in s["phase"][rows]],
    }
    phase_rows = np.flatnonzero(kind == SpanKind.PHASE)[:MAX_PHASE_SPANS]
    phase_rows = phase_rows[np.argsort(s["start_us"][phase_rows], kind="stable")]
    phases: list[dict[str, Any]] = [
        {
            "name": trace.string(int(s["name"][r])) or enum_name(Phase(int(s["phase"][r]))),
            "phase": enum_name(Phase(int(s["phase"][r]))),
            "start": int(s["start_us"][r]) - t0_us,
            "end": int(s["end_us"][r]) - t0_us,
        }
        for r in phase_rows.tolist()
    ]
    for before, after in zip(phases, phases[1:], strict=False):
        # One row, no overlaps: a phase ends where the next begins (load's span often closes
        # after the first encode has started).
        before["end"] = max(before["start"], min(before["end"], after["start"]))
    return {
        "strings": names,
        "modules": modules,
        "shown": int(len(rows)),
        "total": int(len(module_rows)),
        "phases": phases,
    }


def _payload(analysis: Analysis, markers: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    trace, summ = analysis.trace, analysis.summary
    t0 = _time_origin_us(trace)
    lanes = _lane_payload(trace, t0)
    span_end = max(lanes["modules"]["end"] + [p["end"] for p in lanes["phases"]] + [0])
    return {
        "peak": {"bytes": summ.peak_bytes, "time_us": summ.peak_time_us},
        # Constant weights: by default the timeline shows the memory above them.
        "baseline_bytes": summ.by_category_at_peak.get("weight", 0) + summ.by_category_at_peak.get("buffer", 0),
        "duration_us": max(summ.duration_us, span_end),
        "timelines": {by: _timeline_payload(analysis, by) for by in ("category", "modality", "phase")},
        "palette": PALETTE,
        "lanes": lanes,
        "markers": [
            {
                "time_us": int(m.get("time_us", 0)),
                "label": str(m.get("label", "")),
                "severity": str(m.get("severity", "")),
                "anchor": str(m.get("anchor", "")),
                "finding": int(m.get("finding", 0)),
                "detail": str(m.get("detail", "")),
            }
            for m in markers
        ],
    }


# -- HTML pieces ----------------------------------------------------------------


def _header(trace: Trace, summ: Summary, title: str) -> str:
    meta = trace.metadata
    used: set[str] = set()
    facts: list[tuple[str, str]] = []
    for label, keys in _HEADER_FIELDS:
        for key in keys:
            if key in meta and meta[key] not in (None, ""):
                facts.append((label, _meta_text(key, meta[key])))
                used.add(key)
                break
        else:
            if label == "Device":
                facts.append((label, summ.device))
    if not any(label == "Device" and value == summ.device for label, value in facts):
        facts.append(("Memory device", summ.device))  # the device the numbers below are about
    cards = [
        ("Peak", format_bytes(summ.peak_bytes), f"at {format_us(summ.peak_time_us)}"),
        ("Weights", format_bytes(summ.weights_bytes), "weights + buffers"),
        ("Events", f"{summ.events:,}", f"{trace.num_spans:,} spans"),
        ("Duration", format_us(summ.duration_us), "first to last event"),
    ]
    if summ.file_backed_bytes_at_peak:
        cards.append(("File-backed at peak", format_bytes(summ.file_backed_bytes_at_peak), "mmap'd, reclaimable"))
    fact_html = "".join(f"<div><dt>{escape(k)}</dt><dd>{escape(v)}</dd></div>" for k, v in facts)
    card_html = "".join(
        f'<div class="mw-card"><div class="mw-card-label">{escape(k)}</div>'
        f'<div class="mw-card-value">{escape(v)}</div><div class="mw-card-note">{escape(n)}</div></div>'
        for k, v, n in cards
    )
    rest = [(k, _meta_text(k, v)) for k, v in meta.items() if k not in used]
    details = ""
    if rest:
        rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rest)
        details = (
            f'<details class="mw-meta"><summary>All metadata ({len(rest)})</summary><table>{rows}</table></details>'
        )
    return (
        f'<header class="mw-header"><h1>{escape(title)}</h1><dl class="mw-facts">{fact_html}</dl>'
        f'<div class="mw-cards">{card_html}</div>{details}</header>'
    )


def _asset(name: str) -> str:
    return resources.files("memwarden.report").joinpath("assets", name).read_text(encoding="utf-8")


def _heatmap_section(png: bytes) -> Section:
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("heatmap_png is not a PNG image")
    uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return Section("Allocator heatmap", f'<img class="mw-heatmap" alt="allocator heatmap" src="{uri}">')


# -- public API -----------------------------------------------------------------


def render_html(
    trace: Trace,
    *,
    title: str | None = None,
    extra_sections: Sequence[Section] = (),
    heatmap_png: bytes | None = None,
    markers: Sequence[dict[str, Any]] = (),
    analysis: Analysis | None = None,
    answer: str | None = None,
    lead_sections: Sequence[Section] = (),
) -> str:
    """The whole report as one HTML string; no file or network access.

    ``markers``: points on the timeline (``time_us``, ``label``, ``severity``,
    ``anchor`` = id of the section element they link to), e.g. diagnose findings.
    ``analysis``: the trace's shared Analysis, when the caller has one (else one is made).
    ``answer``: the sentence the page opens with (plain text); ``lead_sections`` come right
    after it, before the timeline (the findings), ``extra_sections`` after the tables.
    """
    if analysis is None:
        analysis = Analysis(trace)
    elif analysis.trace is not trace:
        raise ValueError("the Analysis given belongs to another trace")
    summ = analysis.summary
    model = trace.metadata.get("model") or trace.metadata.get("model_name")
    page_title = title or (f"memwarden report: {model}" if model else "memwarden report")
    script = _asset("report.js")
    script_hash = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    csp = f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{script_hash}'"

    sections = list(extra_sections)
    resident = resident_section_html(trace.metadata, summ.resident)
    if resident:
        sections.insert(0, Section("Traced vs resident", resident))
    if heatmap_png is not None:
        sections.append(_heatmap_section(heatmap_png))
    taken = {"timeline", "breakdown", "sites", "modules", "answer"}
    lead_ids = [_slug(sec.title, taken) for sec in lead_sections]
    extra_ids = [_slug(sec.title, taken) for sec in sections]
    nav = [(sid, sec.title) for sid, sec in zip(lead_ids, lead_sections, strict=True)]
    nav += [("timeline", "Timeline"), ("breakdown", "Breakdown"), ("sites", "Top sites"), ("modules", "Modules")]
    nav += [(sid, sec.title) for sid, sec in zip(extra_ids, sections, strict=True)]
    nav_html = "".join(f'<a href="#{escape(sid)}">{escape(text)}</a>' for sid, text in nav)

    def section_html(ids: list[str], secs: Sequence[Section]) -> str:
        return "".join(
            f'<section id="{escape(sid)}" class="mw-section"><h2>{escape(sec.title)}</h2>{sec.html}</section>'
            for sid, sec in zip(ids, secs, strict=True)
        )

    lead_html = section_html(lead_ids, lead_sections)
    extra_html = section_html(extra_ids, sections)
    answer_html = f'<p id="answer" class="mw-answer">{escape(answer)}</p>' if answer else ""
    n_modules = int(np.count_nonzero(trace.spans["kind"] == SpanKind.MODULE))
    body = f"""{_header(trace, summ, page_title)}
{answer_html}
<nav class="mw-nav">{nav_html}</nav>
{lead_html}
<section id="timeline" class="mw-section">
<div class="mw-toolbar"><h2>Live memory</h2>
<div class="mw-stack" role="group" aria-label="stack by">stack by
<button type="button" data-by="category" class="on">category</button><button type="button" data-by="modality">modality</button><button type="button" data-by="phase">phase</button></div>
<button type="button" id="mw-baseline" class="mw-reset" title="the y-axis starts at the constant weights; click to start it at zero">y: above weights</button>
<button type="button" id="mw-reset" class="mw-reset" hidden>reset zoom</button>
<span class="mw-hint">drag to zoom · double-click to reset · click a legend entry to hide it · hover a numbered marker</span></div>
<div id="mw-legend" class="mw-legend"></div>
<div class="mw-plot"><canvas id="mw-timeline" aria-label="live bytes over time"></canvas></div>
<h3 class="mw-lanes-title">Module calls <span class="mw-note">{n_modules:,} calls; colour = modality; hover for input fingerprint</span></h3>
<div class="mw-plot"><canvas id="mw-lanes" aria-label="module calls over time"></canvas></div>
<div id="mw-lanes-note" class="mw-note"></div>
</section>
<section id="breakdown" class="mw-section"><h2>Breakdown</h2>{breakdowns(summ)}</section>
<section id="sites" class="mw-section"><h2>Top allocation sites at peak</h2>
<p class="mw-note">Blocks live at the peak event, grouped by module, op, category and modality.</p>{sites(summ)}</section>
<section id="modules" class="mw-section"><h2>Heaviest modules by time</h2>
<p class="mw-note">Calls grouped by module path. Fewer distinct input fingerprints than calls means the module ran again on content it had already seen.</p>{heaviest_modules(trace)}</section>
{extra_html}
<div id="mw-tooltip" class="mw-tooltip" hidden></div>
<div id="mw-status" data-series="0" data-points="0" data-spans="0" hidden></div>
<footer class="mw-footer">memwarden · self-contained report, works offline</footer>
<script type="application/json" id="mw-data">{_json_for_script(_payload(analysis, markers))}</script>
<script>{script}</script>
"""
    return report_page(page_title, body.rstrip("\n"), csp=csp)


def write_html(trace: Trace, path: str | os.PathLike[str], **kwargs: Any) -> Path:
    """Render and write atomically: readers never see a half-written report."""
    from memwarden.trace.io import atomic_write

    return atomic_write(path, render_html(trace, **kwargs).encode("utf-8"))
