"""A self-contained HTML comparison of two campaigns (``memwarden stress --html``).

Same house rules as ``report/html.py``: one file, the house stylesheet inlined
(``html_page.report_page``), charts as inline SVG (no script at all), and a Content-Security-Policy of
``default-src 'none'`` so the page fetches nothing and runs nothing. Every string that came
from a config or a worker (names, error text) is HTML-escaped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from memwarden.html_page import escape, report_page
from memwarden.units import format_bytes

__all__ = ["render_stress_html", "render_sweep_html", "write_stress_html", "write_sweep_html"]

_COLORS = {"ok": "#59a14f", "oom": "#e15759", "crash": "#b07aa1", "lost": "#bab0ac", "a": "#4e79a7", "b": "#f28e2b"}


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _signed(value: float) -> str:
    return ("−" if value < 0 else "+") + _s(abs(value))


def _b(value: int | None) -> str:
    return "–" if not value else format_bytes(value)


def _status_bars(side: dict[str, Any]) -> str:
    """One horizontal bar split by status, widths proportional to counts."""
    total = max(side["requests"], 1)
    x, parts = 0.0, []
    for status in ("ok", "oom", "crash", "lost"):
        w = 400 * side[status] / total
        if w:
            parts.append(
                f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="18" fill="{_COLORS[status]}">'
                f"<title>{status}: {side[status]}</title></rect>"
            )
        x += w
    return f'<svg width="400" height="18" role="img" aria-label="requests by status">{"".join(parts)}</svg>'


def _cdf(result: dict[str, Any], records: dict[str, list[dict[str, Any]]]) -> str:
    """Latency CDF of ok requests, both sides on one linear axis, drawn as steps (one answered
    request is one visible step and dot) with ticks and titles on both axes."""
    lat = {
        k: sorted(r["latency_s"] for r in rs if r["status"] == "ok" and r["latency_s"] is not None)
        for k, rs in records.items()
    }
    top = max((v[-1] for v in lat.values() if v), default=0.0)
    if top <= 0:
        return '<p class="mw-empty">no successful requests</p>'
    width, height, left, right, pad = 640, 240, 52, 16, 40
    plot_w, plot_h = width - left - right, height - 2 * pad

    def x_of(v: float) -> float:
        return left + plot_w * v / top

    def y_of(share: float) -> float:
        return height - pad - plot_h * share

    paths = []
    for side, values in lat.items():
        if not values:
            continue
        n = len(values)
        d = f"M{left:.1f},{y_of(0):.1f}"
        for i, v in enumerate(values):
            d += f" L{x_of(v):.1f},{y_of(i / n):.1f} L{x_of(v):.1f},{y_of((i + 1) / n):.1f}"
        d += f" L{x_of(top):.1f},{y_of(1):.1f}"
        name = escape(result[side]["name"])
        dots = "".join(
            f'<circle cx="{x_of(v):.1f}" cy="{y_of((i + 1) / n):.1f}" r="2.5" fill="{_COLORS[side]}">'
            f"<title>{side.upper()}: request answered in {_s(v)} ({i + 1} of {n})</title></circle>"
            for i, v in enumerate(values[:400])
        )
        paths.append(
            f'<path d="{d}" fill="none" stroke="{_COLORS[side]}" stroke-width="2">'
            f"<title>{side.upper()}: {name}</title></path>{dots}"
        )
    ticks = []
    for k in range(5):
        v, share = top * k / 4, k / 4
        ticks.append(
            f'<line x1="{x_of(v):.1f}" y1="{y_of(0):.1f}" x2="{x_of(v):.1f}" y2="{y_of(1):.1f}" stroke="#eee"/>'
            f'<text x="{x_of(v):.1f}" y="{y_of(0) + 14:.1f}" text-anchor="middle" font-size="11">'
            f"{'0' if k == 0 else _s(v)}</text>"
            f'<line x1="{left}" y1="{y_of(share):.1f}" x2="{width - right}" y2="{y_of(share):.1f}" stroke="#eee"/>'
            f'<text x="{left - 6}" y="{y_of(share) + 4:.1f}" text-anchor="end" font-size="11">{share:.0%}</text>'
        )
    axis = (
        "".join(ticks) + f'<line x1="{left}" y1="{y_of(0)}" x2="{width - right}" y2="{y_of(0)}" stroke="#999"/>'
        f'<line x1="{left}" y1="{y_of(1)}" x2="{left}" y2="{y_of(0)}" stroke="#999"/>'
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle" font-size="12">'
        "latency of answered requests</text>"
        f'<text x="12" y="{pad + plot_h / 2:.1f}" text-anchor="middle" font-size="12" '
        f'transform="rotate(-90 12 {pad + plot_h / 2:.1f})">share answered within</text>'
    )
    legend = "".join(
        f'<span class="mw-legend-item"><span style="display:inline-block;width:12px;height:3px;background:{_COLORS[k]}"></span>'
        f"{k.upper()}: {escape(result[k]['name'])} ({len(lat.get(k, []))} answered)</span>"
        for k in ("a", "b")
    )
    return (
        f'<div class="mw-legend">{legend}</div><svg width="{width}" height="{height}" role="img" '
        f'aria-label="latency CDF">{axis}{"".join(paths)}</svg>'
    )


def _table(result: dict[str, Any]) -> str:
    rows = [
        ("serving mode", lambda s: escape(s["mode"])),
        ("requests", lambda s: s["requests"]),
        ("ok", lambda s: s["ok"]),
        ("oom", lambda s: s["oom"]),
        ("crash", lambda s: s["crash"]),
        ("lost", lambda s: s["lost"]),
        ("failure rate", lambda s: f"{s['failure_rate'] * 100:.1f} %"),
        ("worker restarts", lambda s: s["worker_restarts"]),
        ("p50 latency", lambda s: _s(s["p50_latency_s"])),
        (
            "p50 95% CI",
            lambda s: (
                "–" if not s["p50_latency_ci_s"] else f"{_s(s['p50_latency_ci_s'][0])} – {_s(s['p50_latency_ci_s'][1])}"
            ),
        ),
        ("p95 latency", lambda s: _s(s["p95_latency_s"])),
        ("recovery p50", lambda s: _s(s["recovery_p50_s"])),
        ("peak RSS p50", lambda s: _b(s["peak_rss_p50_bytes"])),
        ("peak RSS max", lambda s: _b(s["peak_rss_max_bytes"])),
        ("by status", _status_bars),
    ]
    head = f"<tr><th></th><th>A: {escape(result['a']['name'])}</th><th>B: {escape(result['b']['name'])}</th></tr>"
    body = "".join(
        f'<tr><th>{label}</th><td class="num">{fn(result["a"])}</td><td class="num">{fn(result["b"])}</td></tr>'
        for label, fn in rows
    )
    return f'<table class="mw-table"><thead>{head}</thead><tbody>{body}</tbody></table>'


def _failures(records: dict[str, list[dict[str, Any]]]) -> str:
    rows = [(side, r) for side, rs in records.items() for r in rs if r["status"] != "ok"][:200]
    if not rows:
        return '<p class="mw-empty">no failed request</p>'
    body = "".join(
        f'<tr><td>{side.upper()}</td><td class="num">{r["index"]}</td><td>{escape(r["status"])}</td>'
        f'<td class="num">{_s(r["latency_s"])}</td><td>{escape((r.get("error") or "")[:300])}</td></tr>'
        for side, r in rows
    )
    return (
        '<table class="mw-table"><thead><tr><th>side</th><th class="num">request</th><th>status</th>'
        f'<th class="num">after</th><th>error</th></tr></thead><tbody>{body}</tbody></table>'
    )


def render_stress_html(result: dict[str, Any], records: dict[str, list[dict[str, Any]]] | None = None) -> str:
    """The page for ``CampaignResult.to_json(records=True)``; pure."""
    records = records if records is not None else result.get("records", {"a": [], "b": []})
    p = result["failure_rate_p_value"]
    diff = result.get("p50_latency_diff_ci_s")
    verdict = "the failure rates differ (p < 0.05)" if p < 0.05 else "no significant difference in failure rate"
    title = f"memwarden stress: {result['a']['name']} vs {result['b']['name']}"
    inject = ", ".join(result.get("inject") or []) or "none"
    facts = [
        ("runs per side", result["runs"]),
        ("seed", result["seed"]),
        ("injected", inject),
        ("executor", result.get("executor", "local")),
        ("Fisher exact p (failure rate)", f"{p:.4g}"),
        ("p50 latency B − A, 95% CI", "–" if not diff else f"{_signed(diff[0])} … {_signed(diff[1])}"),
        ("answers equal (ok on both sides)", f"{result['outputs_equal']} / {result['outputs_compared']}"),
    ]
    facts_html = "".join(f"<div><dt>{escape(k)}</dt><dd>{escape(v)}</dd></div>" for k, v in facts)
    return _page(
        title,
        f"""<header class="mw-header"><h1>{escape(title)}</h1><dl class="mw-facts">{facts_html}</dl>
<p>{escape(verdict)}.</p></header>
<section id="summary" class="mw-section"><h2>Summary</h2>{_table(result)}</section>
<section id="latency" class="mw-section"><h2>Latency of answered requests (CDF)</h2>{_cdf(result, records)}</section>
<section id="failures" class="mw-section"><h2>Failed requests</h2>{_failures(records)}</section>
""",
    )


def _page(title: str, body: str) -> str:
    """A self-contained page: the report stylesheet inline, no script, a strict CSP."""
    footer = '<footer class="mw-footer">memwarden · self-contained report, works offline</footer>'
    return report_page(title, f"{body}{footer}")


def write_stress_html(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    from memwarden.trace.io import atomic_write

    return atomic_write(path, render_stress_html(result).encode("utf-8"))


def _curves(data: dict[str, Any]) -> str:
    """Failure rate against the swept value, one line per side, 95% Wilson intervals as whiskers (SVG)."""
    points = data["points"]
    w, h, left, right, top, bottom = 640, 300, 56, 44, 16, 44
    xs = [p["value"] for p in points]
    lo, hi = min(xs), max(xs)

    def x(v: float) -> float:
        return left + (w - left - right) * ((v - lo) / (hi - lo) if hi != lo else 0.5)

    def y(r: float) -> float:
        return top + (h - top - bottom) * (1 - r)

    parts = [
        f'<line x1="{left}" y1="{y(0)}" x2="{w - right}" y2="{y(0)}" stroke="#888"/>',
        f'<line x1="{left}" y1="{y(0)}" x2="{left}" y2="{y(1)}" stroke="#888"/>',
    ]
    for r in (0, 0.25, 0.5, 0.75, 1):
        parts.append(f'<text x="{left - 6}" y="{y(r) + 4:.1f}" text-anchor="end" font-size="11">{r:.0%}</text>')
    for p in points:
        parts.append(
            f'<text x="{x(p["value"]):.1f}" y="{h - bottom + 16}" text-anchor="middle" '
            f'font-size="11">{escape(p["label"])}</text>'
        )
    for side, shift in (("a", -3), ("b", 3)):
        color = _COLORS[side]
        line = " ".join(f"{x(p['value']) + shift:.1f},{y(p[side]['rate']):.1f}" for p in points)
        parts.append(f'<polyline class="curve-{side}" points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        for p in points:
            cx = x(p["value"]) + shift
            parts.append(
                f'<line x1="{cx:.1f}" y1="{y(p[side]["low"]):.1f}" x2="{cx:.1f}" y2="{y(p[side]["high"]):.1f}" '
                f'stroke="{color}" stroke-width="1"/><circle cx="{cx:.1f}" cy="{y(p[side]["rate"]):.1f}" r="3" '
                f'fill="{color}"><title>{escape(data[side + "_name"])} at {escape(p["label"])}: '
                f"{p[side]['failed']}/{p[side]['requests']} failed</title></circle>"
            )
    axis = f"{data['kind']}:{data['key']}"
    parts.append(f'<text x="{(w + left) / 2}" y="{h - 6}" text-anchor="middle" font-size="12">{escape(axis)}</text>')
    legend = "".join(
        f'<span style="color:{_COLORS[s]}">&#9632; {escape(data[s + "_name"])}</span> ' for s in ("a", "b")
    )
    return (
        f'<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="failure rate curves">'
        f"{''.join(parts)}</svg><p>{legend}</p>"
    )


def render_sweep_html(data: dict[str, Any]) -> str:
    """The page for ``sweep.run_sweep``'s result: the two failure-rate curves and the table; pure."""
    title = f"memwarden stress sweep: {data['a_name']} vs {data['b_name']} over {data['kind']}:{data['key']}"
    rows = "".join(
        f"<tr><td>{escape(p['label'])}</td>"
        + "".join(
            f'<td class="num">{p[s]["failed"]}/{p[s]["requests"]} ({p[s]["rate"]:.0%}, '
            f'{p[s]["low"]:.0%}–{p[s]["high"]:.0%})</td><td class="num">{p[s]["oom"]}/{p[s]["crash"]}/'
            f"{p[s]['lost']}</td>"
            for s in ("a", "b")
        )
        + f'<td class="num">{p["failure_rate_p_value"]:.3g}</td></tr>'
        for p in data["points"]
    )
    head = (
        f"<tr><th>{escape(data['kind'])}:{escape(data['key'])}</th><th>A failed (95% CI)</th><th>A oom/crash/lost</th>"
        "<th>B failed (95% CI)</th><th>B oom/crash/lost</th><th>Fisher p</th></tr>"
    )
    facts = [
        ("requests per side and point", data["runs"]),
        ("seed", data["seed"]),
        ("also injected", ", ".join(data.get("inject") or []) or "none"),
    ]
    facts_html = "".join(f"<div><dt>{escape(k)}</dt><dd>{escape(v)}</dd></div>" for k, v in facts)
    return _page(
        title,
        f"""<header class="mw-header"><h1>{escape(title)}</h1><dl class="mw-facts">{facts_html}</dl></header>
<section id="curve" class="mw-section"><h2>Failure rate (requests not answered), 95% Wilson intervals</h2>
{_curves(data)}</section>
<section id="points" class="mw-section"><h2>Points</h2><table class="mw-table"><thead>{head}</thead>
<tbody>{rows}</tbody></table></section>
""",
    )


def write_sweep_html(data: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    from memwarden.trace.io import atomic_write

    return atomic_write(path, render_sweep_html(data).encode("utf-8"))
