"""``memwarden partition`` rendered: a terminal table and a self-contained HTML page."""

from __future__ import annotations

from collections import Counter
from html import escape
from typing import Any

from memwarden.html_page import html_page
from memwarden.units import format_bytes

__all__ = ["partition_html", "partition_table"]


def _rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**result["solution"], "label": f"memwarden ({result['solution']['method']})"}] + [
        {**b, "label": b["method"]} for b in result["baselines"]
    ]


def partition_table(result: dict[str, Any], *, title: str) -> Any:
    from rich.table import Table

    table = Table(title=title)
    table.add_column("method")
    table.add_column("latency", justify="right")
    table.add_column("compute", justify="right")
    table.add_column("transfers", justify="right")
    for unit in result["units"]:
        table.add_column(f"{unit} mem / nodes", justify="right")
    table.add_column("fits")
    for row in _rows(result):
        cells = [
            row["label"],
            f"{row['latency_us'] / 1e3:.3f} ms",
            f"{row['compute_us'] / 1e3:.3f} ms",
            f"{row['transfer_us'] / 1e3:.3f} ms",
        ]
        for unit in result["units"]:
            cells.append(f"{format_bytes(row['memory_bytes'][unit])} / {row['nodes_per_unit'][unit]}")
        cells.append("yes" if row["feasible"] else "NO: " + "; ".join(row["violations"]))
        table.add_row(*cells)
    return table


def partition_html(result: dict[str, Any], *, title: str) -> str:
    units = result["units"]
    head = "".join(f"<th>{escape(u)} memory</th><th>{escape(u)} nodes</th>" for u in units)
    body = []
    for row in _rows(result):
        cells = "".join(
            f"<td>{escape(format_bytes(row['memory_bytes'][u]))}</td><td>{row['nodes_per_unit'][u]}</td>" for u in units
        )
        fits = "yes" if row["feasible"] else "NO: " + escape("; ".join(row["violations"]))
        body.append(
            f"<tr><td>{escape(row['label'])}</td><td>{row['latency_us'] / 1e3:.3f} ms</td>"
            f"<td>{row['transfer_us'] / 1e3:.3f} ms</td>{cells}<td>{fits}</td></tr>"
        )
    per_module: Counter[tuple[str, str]] = Counter()
    for node in result["solution"].get("nodes", []):
        module = ".".join(node["module"].split(".")[:3]) or "(graph)"
        per_module[(module, node["unit"])] += 1
    modules = "".join(
        f"<tr><td>{escape(m)}</td><td>{escape(u)}</td><td>{count}</td></tr>"
        for (m, u), count in sorted(per_module.items())
    )
    limits = ", ".join(f"{escape(u)} {escape(format_bytes(b))}" for u, b in result["capacity_bytes"].items())
    style = (
        "body{font-family:system-ui,sans-serif;margin:2em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
        "td:first-child{text-align:left}"
    )
    return html_page(
        title,
        style=style,
        body=(
            f"<h1>{escape(title)}</h1><p>{result['nodes']} nodes, {result['edges']} edges; unit limits: {limits}. "
            "Latency is simulated (compute + transfers, nodes one at a time); memory is weights + live outputs.</p>"
            f"<table><tr><th>method</th><th>latency</th><th>transfers</th>{head}<th>fits</th></tr>{''.join(body)}</table>"
            f"<h2>Where the solution puts each module</h2><table><tr><th>module</th><th>unit</th><th>nodes</th></tr>{modules}</table>"
        ),
    )
