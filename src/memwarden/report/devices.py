"""Device profiles as terminal tables (rich). Pure: profiles in, renderables out."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from memwarden.models.device_profile import DeviceProfile
from memwarden.report.columns import Col, FitTable
from memwarden.units import format_bytes, format_us

__all__ = ["profile_details", "profile_header", "profiles_table"]

_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")


def profiles_table(profiles: list[DeviceProfile]) -> FitTable:
    """One row per profile: memory, the share a model can use, the fastest tier's bandwidth.
    In a narrow terminal the name goes first (``devices PROFILE`` shows it), then the kind."""
    columns = [
        Col("id"),
        Col("name", drop=1, elide=True, min_width=14),
        Col("total", justify="right"),
        Col("usable", justify="right"),
        Col("unified", drop=3),
        Col("bandwidth", justify="right"),
        Col("kind", drop=2),
    ]
    rows = [
        [
            p.id,
            p.name,
            format_bytes(p.total_memory_bytes),
            format_bytes(p.usable_bytes),
            "yes" if p.unified_memory else "no",
            f"{p.fastest_tier.bandwidth_gbps:g} GB/s",
            p.kind,
        ]
        for p in profiles
    ]
    return FitTable(columns, rows, title="Device profiles" if len(profiles) > 1 else None)


def profile_header(p: DeviceProfile) -> Table:
    """One profile's headline figures as label/value lines (a one-row table would squeeze)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row("id", p.id)
    grid.add_row("name", p.name)
    grid.add_row("kind", p.kind)
    grid.add_row(
        "memory",
        f"{format_bytes(p.total_memory_bytes)} total, {format_bytes(p.usable_bytes)} usable by a "
        f"model ({'unified with the CPU' if p.unified_memory else 'dedicated'})",
    )
    grid.add_row("bandwidth", f"{p.fastest_tier.bandwidth_gbps:g} GB/s (fastest tier)")
    return grid


def profile_details(p: DeviceProfile) -> Group:
    """One profile in full: its memory tiers, compute engines and where the figures come from."""
    tiers = Table(title="Memory tiers")
    for col in ("tier", "capacity", "bandwidth", "latency"):
        tiers.add_column(col, justify="left" if col == "tier" else "right")
    for t in p.tiers:
        tiers.add_row(t.name, format_bytes(t.capacity_bytes), f"{t.bandwidth_gbps:g} GB/s", _latency(t.latency_us))

    compute = Table(title="Compute (dense peak, TFLOPS / TOPS)")
    compute.add_column("engine")
    for dtype in _DTYPES:
        compute.add_column(dtype, justify="right")
    engines = [("main", p.compute.peak_tflops)] + [(u.name, u.peak_tflops) for u in p.compute.units]
    for name, rates in engines:
        compute.add_row(name, *(_rate(rates.get(d)) for d in _DTYPES))

    lines = (
        f"reserved for the OS and others: {format_bytes(p.os_reserved_bytes)}\n"
        f"accelerators: {', '.join(p.compute.accelerators)}\n"
        f"telemetry: {', '.join(p.telemetry) or 'none'}\n"
        f"source: {p.source}"
    )
    return Group(tiers, compute, lines)


def _latency(us: float) -> str:
    return f"{us * 1000:.0f} ns" if us < 1 else format_us(us)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
