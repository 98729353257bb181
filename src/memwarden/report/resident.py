"""The report's "Traced vs resident" chart: what the process held (resident samples from
``memwarden trace``, every 100 ms) against what the trace accounts for, the difference drawn as
its own "not traced" series. Plain inline SVG: no script, nothing fetched."""

from __future__ import annotations

import html
from typing import Any

from memwarden.units import format_bytes, format_us

__all__ = ["resident_section_html"]

_W, _H, _PAD = 720, 220, 40
_SERIES = (("rss", "resident (RSS)", "#444"), ("traced", "traced", "#2a7ab8"), ("not_traced", "not traced", "#d9822b"))


def _ints(values: Any) -> list[int]:
    return [int(v) if isinstance(v, int) and not isinstance(v, bool) else 0 for v in values or []]


def resident_section_html(metadata: dict[str, Any], summary: dict[str, Any] | None) -> str:
    """The section's markup, or "" when the trace has no resident samples."""
    resident = metadata.get("resident")
    if not isinstance(resident, dict) or not summary:
        return ""
    cols = resident.get("samples") or {}
    times = _ints(cols.get("time_us"))
    series = {key: _ints(cols.get(key)) for key, _, _ in _SERIES}
    n = min([len(times)] + [len(v) for v in series.values()])
    if n == 0:
        return ""
    top = max(max(v[:n]) for v in series.values()) or 1
    t_end = max(times[n - 1], 1)

    def point(t: int, b: int) -> str:
        x = _PAD + (_W - 2 * _PAD) * (t / t_end)
        y = _H - _PAD - (_H - 2 * _PAD) * (b / top)
        return f"{x:.1f},{y:.1f}"

    lines, legend = [], []
    for key, label, colour in _SERIES:
        pts = " ".join(point(times[k], series[key][k]) for k in range(n))
        lines.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{pts}">'
            f"<title>{html.escape(label)}</title></polyline>"
        )
        if n == 1:  # a single sample: a dot, not an invisible line
            x, y = point(times[0], series[key][0]).split(",")
            lines.append(
                f'<circle cx="{x}" cy="{y}" r="4" fill="{colour}"><title>{html.escape(label)}</title></circle>'
            )
        legend.append(f'<span style="color:{colour}">■</span> {html.escape(label)}')
    axis = (
        f'<text x="{_PAD}" y="{_PAD - 10}" font-size="11">{html.escape(format_bytes(top))}</text>'
        f'<text x="{_W - _PAD}" y="{_H - 10}" font-size="11" text-anchor="end">{html.escape(format_us(t_end))}</text>'
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="#999"/>'
    )
    note = (
        f"At the resident peak ({format_bytes(summary['peak_rss_bytes'])}) the trace accounts for "
        f"{format_bytes(summary['traced_at_rss_peak_bytes'])}; {format_bytes(summary['not_traced_bytes'])} is "
        "not traced (native libraries such as numpy or BLAS, allocator caches, the interpreter)."
    )
    return (
        f'<p class="mw-note">{html.escape(note)}</p><div class="mw-legend">{" ".join(legend)}</div>'
        f'<svg role="img" aria-label="traced vs resident memory over time" viewBox="0 0 {_W} {_H}" '
        f'width="100%" style="max-width:{_W}px">{axis}{"".join(lines)}</svg>'
    )
