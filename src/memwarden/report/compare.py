"""Two traces side by side: the same model in PyTorch eager and in ONNX Runtime, or two ORT
settings (arena on/off, memory pattern on/off). The comparison is ``analyze.baseline``'s (the one
``memwarden check --baseline`` gates on), taken at each trace's peak; this module names the two
sides and renders it: a terminal table, an HTML page, JSON."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

from memwarden.analyze.baseline import Comparison, Delta, compare_at_peak
from memwarden.html_page import html_page
from memwarden.trace.model import Trace
from memwarden.units import format_bytes

__all__ = ["SideBySide", "compare", "comparison_html", "comparison_table", "describe"]


@dataclass(frozen=True)
class SideBySide:
    """A comparison at the peak with its two sides named; a row is a ``Delta``: its kind is the
    table's section, its key the label, old is A and new is B."""

    a_name: str
    b_name: str
    comparison: Comparison

    @property
    def rows(self) -> tuple[Delta, ...]:
        return self.comparison.deltas

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a_name,
            "b": self.b_name,
            "rows": [
                {
                    "section": r.kind,
                    "label": r.key,
                    "a_bytes": r.old_bytes,
                    "b_bytes": r.new_bytes,
                    "delta_bytes": r.delta_bytes,
                }
                for r in self.rows
            ],
        }


def describe(trace: Trace, fallback: str) -> str:
    """A short name for a trace: its capture and, for ORT, the settings."""
    ort = trace.metadata.get("onnxruntime")
    if isinstance(ort, dict):
        arena = "on" if ort.get("arena") else "off"
        pattern = "on" if ort.get("mem_pattern") else "off"
        return f"ORT {ort.get('ep', 'cpu')} (arena {arena}, mem-pattern {pattern})"
    return str(trace.metadata.get("capture") or fallback)


def compare(
    a: Trace, b: Trace, *, a_name: str = "A", b_name: str = "B", module_depth: int = 4, top: int = 15
) -> SideBySide:
    """``a`` against ``b`` at their peaks; the ``top`` modules holding most in either."""
    return SideBySide(a_name, b_name, compare_at_peak(a, b, module_depth=module_depth, top_modules=top))


def _ratio(row: Delta) -> str:
    return f"{row.new_bytes / row.old_bytes:.2f}x" if row.old_bytes > 0 else "-"


def comparison_table(comparison: SideBySide) -> Any:
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
        shown = row.kind if row.kind != section else ""
        section = row.kind
        sign = "+" if row.delta_bytes > 0 else "-" if row.delta_bytes < 0 else ""
        table.add_row(
            shown,
            row.key,
            format_bytes(row.old_bytes),
            format_bytes(row.new_bytes),
            f"{sign}{format_bytes(abs(row.delta_bytes))}",
            _ratio(row),
        )
    return table


def comparison_html(comparison: SideBySide, *, title: str | None = None) -> str:
    page_title = title or f"{comparison.a_name} vs {comparison.b_name}"
    body = []
    for row in comparison.rows:
        sign = "+" if row.delta_bytes > 0 else "-" if row.delta_bytes < 0 else ""
        body.append(
            f"<tr><td>{escape(row.kind)}</td><td>{escape(row.key)}</td>"
            f"<td>{escape(format_bytes(row.old_bytes))}</td><td>{escape(format_bytes(row.new_bytes))}</td>"
            f"<td>{sign}{escape(format_bytes(abs(row.delta_bytes)))}</td><td>{_ratio(row)}</td></tr>"
        )
    style = (
        "body{font-family:system-ui,sans-serif;margin:2em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
        "td:nth-child(-n+2){text-align:left}"
    )
    return html_page(
        page_title,
        style=style,
        body=(
            f"<h1>{escape(page_title)}</h1><p>A = {escape(comparison.a_name)}; B = {escape(comparison.b_name)}. "
            "Category, modality and module rows are bytes live at each trace's own peak; phase rows are each phase's peak.</p>"
            "<table><tr><th>section</th><th>what</th><th>A</th><th>B</th><th>B - A</th><th>B / A</th></tr>"
            f"{''.join(body)}</table>"
        ),
    )
