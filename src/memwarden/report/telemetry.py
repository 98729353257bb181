"""Telemetry samples and the budgets they imply, as terminal text and tables (rich). Pure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.table import Table

from memwarden.govern.budget import BudgetController
from memwarden.units import format_bytes

__all__ = ["budget_table", "policy_line", "replay_totals_line"]


def policy_line(controller: BudgetController) -> str:
    """The policy and its settings, in one line."""
    p = controller.policy
    cap = "" if controller.cap_bytes is None else f", cap {format_bytes(controller.cap_bytes)}"
    return (
        f"policy {p.name}: min headroom {format_bytes(p.min_headroom_bytes)}, hysteresis {p.hysteresis_s:g} s, "
        f"window {p.window_s:g} s{cap}"
    )


def replay_totals_line(totals: dict[str, Any]) -> str:
    """The changes, forced drops and budget range of a replayed log (``telemetry --replay``)."""
    return (
        f"{totals['changes']} changes ({totals['forced_drops']} forced by the headroom), budget "
        f"{format_bytes(totals['min_budget_bytes'])} .. {format_bytes(totals['max_budget_bytes'])}"
    )


def budget_table(
    rows: list[dict[str, Any]], *, title: str, origin: dict[str, str] | None = None, relative_t: bool = False
) -> Table:
    """One row per sample (a decision's JSON merged with the sample's signals): the signals and
    the budget. ``origin`` names the source of a signal in its column head; ``relative_t`` counts
    time from the first row."""
    origin = origin or {}

    def head(label: str, key: str) -> str:
        return f"{label}\n({origin[key]})" if key in origin else label

    t0 = rows[0]["t"] if rows and relative_t else 0.0
    table = Table(title=title)
    table.add_column("t (s)", justify="right")
    table.add_column(head("available", "mem_available_bytes"), justify="right")
    table.add_column(head("total", "mem_total_bytes"), justify="right")
    table.add_column(head("temp", "temp_c"), justify="right")
    table.add_column(head("power", "power_w"), justify="right")
    table.add_column(head("fps", "fps"), justify="right")
    table.add_column("budget", justify="right", style="bold")
    table.add_column("weights", no_wrap=True)

    def fmt(row: dict[str, Any], key: str, render: Callable[[Any], str]) -> str:
        return "-" if row.get(key) is None else render(row[key])

    for r in rows:
        budget = format_bytes(r["budget_bytes"]) + (" (forced)" if r["forced"] else "")
        table.add_row(
            f"{r['t'] - t0:g}",
            fmt(r, "mem_available_bytes", format_bytes),
            fmt(r, "mem_total_bytes", format_bytes),
            fmt(r, "temp_c", lambda v: f"{v:.1f} °C"),
            fmt(r, "power_w", lambda v: f"{v:.1f} W"),
            fmt(r, "fps", lambda v: f"{v:.1f}"),
            budget,
            " ".join(f"{k} {v:.2f}" for k, v in r["weights"].items() if v < 1) or "-",
        )
    return table
