"""Two traces side by side: the same model in PyTorch eager and in ONNX Runtime, or two ORT
settings (arena on/off, memory pattern on/off). Pure: traces in, a ``Comparison`` out; the
terminal table and the HTML page render it."""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Any

import numpy as np

from memwarden.analyze.analysis import Analysis
from memwarden.analyze.timeline import breakdown_at
from memwarden.trace.model import Trace
from memwarden.units import format_bytes

__all__ = ["Comparison", "Row", "compare", "comparison_html", "comparison_table", "describe"]


@dataclass(frozen=True)
class Row:
    section: str  # "total", "category", "modality", "phase", "module"
    label: str
    a_bytes: int
    b_bytes: int

    @property
    def delta_bytes(self) -> int:
        return self.b_bytes - self.a_bytes


@dataclass(frozen=True)
class Comparison:
    a_name: str
    b_name: str
    rows: list[Row] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a_name, "b": self.b_name,
                "rows": [{"section": r.section, "label": r.label, "a_bytes": r.a_bytes, "b_bytes": r.b_bytes,
                          "delta_bytes": r.delta_bytes} for r in self.rows]}  # fmt: skip


def describe(trace: Trace, fallback: str) -> str:
    """A short name for a trace: its capture and, for ORT, the settings."""
    ort = trace.metadata.get("onnxruntime")
    if isinstance(ort, dict):
        arena = "on" if ort.get("arena") else "off"
        pattern = "on" if ort.get("mem_pattern") else "off"
        return f"ORT {ort.get('ep', 'cpu')} (arena {arena}, mem-pattern {pattern})"
    return str(trace.metadata.get("capture") or fallback)


def _module_at_peak(trace: Trace, analysis: Analysis, depth: int) -> dict[str, int]:
    """Bytes live at the trace's peak per module path cut to ``depth`` components."""
    live = analysis.live_bytes
    if not len(live):
        return {}
    by_module = breakdown_at(trace, int(np.argmax(live)), "module", analysis.device)
    out: dict[str, int] = {}
    for module, nbytes in by_module.items():
        key = ".".join(module.split(".")[:depth]) if module != "(unattributed)" else module
        out[key] = out.get(key, 0) + nbytes
    return out


def compare(
    a: Trace, b: Trace, *, a_name: str = "A", b_name: str = "B", module_depth: int = 4, top: int = 15
) -> Comparison:
    sa, sb = Analysis(a), Analysis(b)
    ma, mb = sa.summary, sb.summary
    rows = [
        Row("total", "peak", ma.peak_bytes, mb.peak_bytes),
        Row("total", "weights", ma.weights_bytes, mb.weights_bytes),
        Row("total", "peak above weights", ma.peak_bytes - ma.weights_bytes, mb.peak_bytes - mb.weights_bytes),
    ]
    for section, da, db in (
        ("category", ma.by_category_at_peak, mb.by_category_at_peak),
        ("modality", ma.by_modality_at_peak, mb.by_modality_at_peak),
        ("phase", ma.by_phase_peak, mb.by_phase_peak),
    ):
        rows += [Row(section, k, int(da.get(k, 0)), int(db.get(k, 0))) for k in sorted(set(da) | set(db))]
    pa, pb = _module_at_peak(a, sa, module_depth), _module_at_peak(b, sb, module_depth)
    modules = sorted(set(pa) | set(pb), key=lambda k: -max(pa.get(k, 0), pb.get(k, 0)))[:top]
    rows += [Row("module", k, pa.get(k, 0), pb.get(k, 0)) for k in modules]
    return Comparison(a_name, b_name, rows)


def _ratio(row: Row) -> str:
    return f"{row.b_bytes / row.a_bytes:.2f}x" if row.a_bytes > 0 else "-"


def comparison_table(comparison: Comparison) -> Any:
    from rich.table import Table

    table = Table(title=f"{comparison.a_name}  vs  {comparison.b_name}")
    for name, justify in (
        ("", "left"),
        ("", "left"),
        ("A", "right"),
        ("B", "right"),
        ("B - A", "right"),
        ("B / A", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    section = None
    for row in comparison.rows:
        shown = row.section if row.section != section else ""
        section = row.section
        sign = "+" if row.delta_bytes > 0 else "-" if row.delta_bytes < 0 else ""
        table.add_row(shown, row.label, format_bytes(row.a_bytes), format_bytes(row.b_bytes),
                      f"{sign}{format_bytes(abs(row.delta_bytes))}", _ratio(row))  # fmt: skip
    return table


def comparison_html(comparison: Comparison, *, title: str | None = None) -> str:
    page_title = title or f"{comparison.a_name} vs {comparison.b_name}"
    body = []
    for row in comparison.rows:
        sign = "+" if row.delta_bytes > 0 else "-" if row.delta_bytes < 0 else ""
        body.append(f"<tr><td>{escape(row.section)}</td><td>{escape(row.label)}</td>"
                    f"<td>{escape(format_bytes(row.a_bytes))}</td><td>{escape(format_bytes(row.b_bytes))}</td>"
                    f"<td>{sign}{escape(format_bytes(abs(row.delta_bytes)))}</td><td>{_ratio(row)}</td></tr>")  # fmt: skip
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{escape(page_title)}</title><style>body{{font-family:system-ui,sans-serif;margin:2em}}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
        "td:nth-child(-n+2){text-align:left}</style></head><body>"
        f"<h1>{escape(page_title)}</h1><p>A = {escape(comparison.a_name)}; B = {escape(comparison.b_name)}. "
        "Category, modality and module rows are bytes live at each trace's own peak; phase rows are each phase's peak.</p>"
        "<table><tr><th>section</th><th>what</th><th>A</th><th>B</th><th>B - A</th><th>B / A</th></tr>"
        f"{''.join(body)}</table></body></html>"
    )
