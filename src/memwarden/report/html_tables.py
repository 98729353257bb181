"""The report's tables as trusted HTML (every trace string escaped): breakdowns at the peak, the
top allocation sites (weights apart, as the terminal shows them) and the heaviest modules."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from memwarden.analyze.timeline import Summary
from memwarden.html_page import escape
from memwarden.trace.model import Modality, Phase, SpanKind, Trace, enum_name
from memwarden.units import format_bytes, format_us

__all__ = ["PALETTE", "breakdowns", "heaviest_modules", "sites"]

TOP_MODULES = 25

# Tableau-10 based, one fixed colour per label so a label looks the same in every chart and table.
PALETTE: dict[str, dict[str, str]] = {
    "category": {
        "weight": "#4e79a7",
        "buffer": "#a0cbe8",
        "activation": "#f28e2b",
        "kv_cache": "#59a14f",
        "gradient": "#b07aa1",
        "optimizer_state": "#9c755f",
        "temporary": "#edc948",
        "input": "#76b7b2",
        "other": "#bab0ac",
    },
    "modality": {
        "vision": "#f28e2b",
        "audio": "#76b7b2",
        "text": "#4e79a7",
        "fusion": "#b07aa1",
        "shared": "#bab0ac",
    },
    "phase": {
        "load": "#9c755f",
        "encode": "#f28e2b",
        "prefill": "#4e79a7",
        "decode": "#59a14f",
        "backward": "#e15759",
        "optimizer": "#b07aa1",
        "other": "#bab0ac",
    },
}


def _bar_table(
    rows: Iterable[tuple[str, int]], scale_bytes: int, colors: dict[str, str], label: str, share: str
) -> str:
    rows = [(name, nbytes) for name, nbytes in rows if nbytes]
    if not rows:
        return '<p class="mw-empty">nothing recorded</p>'
    scale = max(scale_bytes, max(abs(b) for _, b in rows), 1)
    out = [
        f'<table class="mw-bars"><thead><tr><th>{escape(label)}</th><th class="num">bytes</th><th class="num">{escape(share)}</th><th></th></tr></thead><tbody>'
    ]
    for name, nbytes in rows:
        width = max(0.0, 100.0 * nbytes / scale)
        color = colors.get(name, "#888")
        out.append(
            f'<tr><td><span class="mw-swatch" style="background:{color}"></span>{escape(name)}</td>'
            f'<td class="num">{escape(format_bytes(nbytes))}</td><td class="num">{width:.1f}%</td>'
            f'<td class="mw-bar-cell"><div class="mw-bar" style="width:{width:.2f}%;background:{color}"></div></td></tr>'
        )
    out.append("</tbody></table>")
    return "".join(out)


def _ordered(values: dict[str, int], order: Sequence[str]) -> list[tuple[str, int]]:
    rank = {name: i for i, name in enumerate(order)}
    return sorted(values.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


def breakdowns(summ: Summary) -> str:
    phases = [enum_name(p) for p in Phase]
    by_cat = sorted(summ.by_category_at_peak.items(), key=lambda kv: -kv[1])
    by_mod = sorted(summ.by_modality_at_peak.items(), key=lambda kv: -kv[1])
    return (
        '<div class="mw-grid">'
        f"<div><h3>At peak, by category</h3>{_bar_table(by_cat, summ.peak_bytes, PALETTE['category'], 'category', 'of peak')}</div>"
        f"<div><h3>At peak, by modality</h3>{_bar_table(by_mod, summ.peak_bytes, PALETTE['modality'], 'modality', 'of peak')}</div>"
        f"<div><h3>Peak of each phase</h3>{_bar_table(_ordered(summ.by_phase_peak, phases), summ.peak_bytes, PALETTE['phase'], 'phase', 'of peak')}</div>"
        f"<div><h3>Weights by modality</h3>{_bar_table(sorted(summ.weights_by_modality.items(), key=lambda kv: -kv[1]), summ.weights_bytes, PALETTE['modality'], 'modality', 'of weights')}</div>"
        "</div>"
    )


def sites(summ: Summary) -> str:
    """The sites live at the peak: working memory first (what a change can shrink), then the
    weights in one collapsed table (they are constant and say little per row)."""
    if not summ.top_sites_at_peak:
        return '<p class="mw-empty">no live allocations at the peak</p>'
    peak = max(summ.peak_bytes, 1)
    working = [x for x in summ.top_sites_at_peak if x.category not in _WEIGHTS]
    weights = [x for x in summ.top_sites_at_peak if x.category in _WEIGHTS]
    out = []
    if working:
        out.append(f"<h3>Working memory (weights aside)</h3>{_site_table(working, peak)}")
    if weights:
        total = sum(x.nbytes for x in weights)
        out.append(
            f'<details class="mw-weights"><summary>Weights and buffers: {len(weights)} sites, '
            f"{escape(format_bytes(total))} at the peak (constant after load; {escape(format_bytes(summ.weights_bytes))} "
            f"in all)</summary>{_site_table(weights, peak)}</details>"
        )
    return "".join(out)


_WEIGHTS = ("weight", "buffer")


def _site_table(rows: list[Any], peak: int) -> str:
    body = "".join(
        f'<tr><td class="num">{escape(format_bytes(s.nbytes))}</td><td class="num">{100 * s.nbytes / peak:.1f}%</td>'
        f'<td class="mw-path">{escape(s.module)}</td><td>{escape(s.op)}</td>'
        f'<td><span class="mw-swatch" style="background:{PALETTE["category"].get(s.category, "#888")}"></span>{escape(s.category)}</td>'
        f'<td><span class="mw-swatch" style="background:{PALETTE["modality"].get(s.modality, "#888")}"></span>{escape(s.modality)}</td>'
        f'<td class="num">{s.count:,}</td></tr>'
        for s in rows
    )
    return (
        '<table class="mw-table"><thead><tr><th class="num">bytes</th><th class="num">of peak</th><th>module</th>'
        f'<th>op</th><th>category</th><th>modality</th><th class="num">blocks</th></tr></thead><tbody>{body}</tbody></table>'
    )


def heaviest_modules(trace: Trace) -> str:
    """Module calls grouped by path, by total inclusive time, with their input fingerprints."""
    s = trace.spans
    rows = np.flatnonzero(s["kind"] == SpanKind.MODULE)
    if len(rows) == 0:
        return '<p class="mw-empty">this trace has no module spans</p>'
    duration = (s["end_us"] - s["start_us"])[rows]
    names = s["name"][rows]
    uniq, inverse = np.unique(names, return_inverse=True)
    total = np.bincount(inverse, weights=duration)
    calls = np.bincount(inverse)
    longest = np.zeros(len(uniq), np.int64)
    np.maximum.at(longest, inverse, duration)
    order = np.argsort(-total, kind="stable")[:TOP_MODULES]
    fps = s["fingerprint"][rows]
    out = []
    for g in order.tolist():
        members = inverse == g
        prints = [trace.strings[int(i)] for i in np.unique(fps[members]) if i >= 0]
        first = rows[np.argmax(members)]
        shown = ", ".join(prints[:3]) + (f" (+{len(prints) - 3} more)" if len(prints) > 3 else "")
        modality = enum_name(Modality(int(s["modality"][first])))
        out.append(
            f'<tr><td class="mw-path">{escape(trace.string(int(uniq[g])) or "(unnamed)")}</td>'
            f'<td><span class="mw-swatch" style="background:{PALETTE["modality"][modality]}"></span>{escape(modality)}</td>'
            f'<td class="num">{int(calls[g]):,}</td><td class="num">{escape(format_us(total[g]))}</td>'
            f'<td class="num">{escape(format_us(longest[g]))}</td>'
            f'<td class="num">{len(prints):,}</td><td class="mw-fp">{escape(shown) or "—"}</td></tr>'
        )
    return (
        '<table class="mw-table"><thead><tr><th>module</th><th>modality</th><th class="num">calls</th>'
        '<th class="num">total time</th><th class="num">longest</th><th class="num">distinct inputs</th>'
        f"<th>input fingerprints</th></tr></thead><tbody>{''.join(out)}</tbody></table>"
    )
