"""Terminal rendering of summaries with rich. Pure: returns renderables."""

from __future__ import annotations

import os

from rich.console import Group
from rich.table import Table
from rich.text import Text

from memwarden.analyze.timeline import Summary
from memwarden.report.columns import Col, FitTable
from memwarden.units import format_bytes, format_us


def _share_table(title: str, values: dict[str, int], total: int) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("", style="bold")
    table.add_column("bytes", justify="right")
    table.add_column("share", justify="right")
    table.add_column("", no_wrap=True)
    for name, value in sorted(values.items(), key=lambda kv: -kv[1]):
        share = value / total if total else 0.0
        table.add_row(name, format_bytes(value), f"{share:6.1%}", "█" * max(0, round(share * 24)))
    return table


def render_summary(s: Summary, source: str = "") -> Group:
    """The summary in lines and tables that fit an 80-column terminal."""
    parts: list[object] = []
    if source:
        parts.append(Text(source, style="dim", overflow="ellipsis", no_wrap=True))
    # Two short lines rather than one long one: a label never parts from its value.
    parts.append(
        Text.assemble(
            ("peak ", "bold"),
            (format_bytes(s.peak_bytes), "bold red"),
            f" at {format_us(s.peak_time_us)} on {s.device}",
        )
    )
    parts.append(
        Text.assemble(
            ("weights ", "bold"),
            format_bytes(s.weights_bytes),
            ("   events ", "bold"),
            f"{s.events:,}",
            ("   duration ", "bold"),
            format_us(s.duration_us),
        )
    )
    if not s.events:
        parts.append(
            Text(
                "No allocations were recorded: nothing was allocated under capture (was the model built and "
                "run inside the traced script?).",
                style="yellow",
            )
        )
        return Group(*parts)  # type: ignore[arg-type]
    if s.file_backed_bytes_at_peak:
        parts.append(Text(f"  of which file-backed (mmap'd): {format_bytes(s.file_backed_bytes_at_peak)}", style="dim"))
    if s.resident:
        r = s.resident
        parts.append(
            Text.assemble(
                ("resident ", "bold"),
                f"peak {format_bytes(r['peak_rss_bytes'])}: traced ",
                format_bytes(r["traced_at_rss_peak_bytes"]),
                ", not traced ",
                (format_bytes(r["not_traced_bytes"]), "yellow"),
                " (native libraries, caches, interpreter)",
            )
        )
    for title, values, total in (
        ("At peak, by category", s.by_category_at_peak, s.peak_bytes),
        ("At peak, by modality", s.by_modality_at_peak, s.peak_bytes),
    ):
        if values:
            parts.append(_share_table(title, values, total))
    if s.by_phase_peak:
        phases = Table(title="Peak per phase", title_justify="left", show_edge=False, pad_edge=False)
        phases.add_column("phase", style="bold")
        phases.add_column("peak", justify="right")
        for name, value in s.by_phase_peak.items():
            phases.add_row(name, format_bytes(value))
        parts.append(phases)
    if s.weights_by_modality:
        parts.append(_share_table("Weights by modality", s.weights_by_modality, s.weights_bytes))
    # Weights are summarised by modality above; the sites that tell a story are the rest.
    non_weight_sites = [x for x in s.top_sites_at_peak if x.category not in ("weight", "buffer")]
    if non_weight_sites:
        columns = [
            Col("module", elide=True, min_width=28),
            Col("op", drop=3),
            Col("category", drop=4),
            Col("modality", drop=1),
            Col("bytes", justify="right"),
            Col("blocks", justify="right", drop=2),
        ]
        rows = [
            [site.module, site.op, site.category, site.modality, format_bytes(site.nbytes), str(site.count)]
            for site in non_weight_sites[:10]
        ]
        parts.append(FitTable(columns, rows, title="Top allocation sites at peak (weights aside)"))
    if s.top_lines_at_peak:
        columns = [
            Col("line", elide=True, min_width=30),
            Col("function", drop=2),
            Col("bytes", justify="right"),
            Col("blocks", justify="right", drop=1),
        ]
        rows = [
            [_where(x.file, x.line), x.function, format_bytes(x.nbytes), str(x.count)] for x in s.top_lines_at_peak[:10]
        ]
        parts.append(FitTable(columns, rows, title="Your lines holding the most at peak"))
    return Group(*parts)  # type: ignore[arg-type]


def _where(file: str, line: int) -> str:
    """``file:line``, the file relative to the working directory when it lies below it."""
    rel = os.path.relpath(file) if os.path.isabs(file) else file
    return f"{rel if not rel.startswith('..') else file}:{line}"


def render_before_after(result: object) -> Table:
    """The demo's naive run and the same turns served by a GovernedSession, side by side."""
    from statistics import median

    g = result.governed  # type: ignore[attr-defined]
    budget = result.config.budget_bytes  # type: ignore[attr-defined]
    before, after = result.summary, g.summary  # type: ignore[attr-defined]
    table = Table(title=f"Before / after: the same turns under a {format_bytes(budget)} budget")
    table.add_column("")
    table.add_column("plain generate()", justify="right")
    table.add_column("GovernedSession", justify="right")

    def verdict(peak: int) -> str:
        return "[green]fits[/]" if peak <= budget else f"[bold red]over by {format_bytes(peak - budget)}[/]"

    def names(findings: list) -> str:
        return ", ".join(sorted({f.pattern for f in findings})) or "none"

    table.add_row("peak", format_bytes(before.peak_bytes), format_bytes(after.peak_bytes))
    table.add_row("budget", verdict(before.peak_bytes), verdict(after.peak_bytes))
    table.add_row("findings", names(result.findings), names(g.findings))  # type: ignore[attr-defined]
    kv_before = before.by_category_at_peak.get("kv_cache", 0)
    kv_after = after.by_category_at_peak.get("kv_cache", 0)
    table.add_row("KV cache at peak", format_bytes(kv_before), f"{format_bytes(kv_after)} (pool, allocated once)")
    if after.peak_bytes > before.peak_bytes:
        table.add_row(
            "why the session peaks higher",
            "",
            f"its KV pool ({format_bytes(g.stats.get('kv_pool_bytes', kv_after))}) is reserved up front for the "
            f"whole conversation; plain's cache grows as it goes ({format_bytes(kv_before)} at its peak)",
        )
    reqs = g.stats.get("requests", [])
    if len(reqs) > 1:
        reused = sum(r["reused_tokens"] for r in reqs[1:])
        prompt = sum(r["prompt_tokens"] for r in reqs[1:])
        table.add_row("turns 2+: prompt tokens reused", "0", f"{reused} of {prompt}")
        table.add_row(
            "turns 2+: median time to first token",
            "",
            f"{median(r['ttft_s'] for r in reqs[1:]) * 1e3:.0f} ms (turn 1: {reqs[0]['ttft_s'] * 1e3:.0f} ms)",
        )
    table.add_row("greedy outputs equal", "", "yes" if g.outputs_equal else "[bold red]no[/]")
    return table
