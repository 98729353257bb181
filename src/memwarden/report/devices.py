"""Device profiles as terminal tables (rich). Pure: profiles in, renderables out."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from memwarden.models.devices import DeviceProfile
from memwarden.units import format_bytes, format_us

__all__ = ["profile_details", "profiles_table"]

_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")


def profiles_table(profiles: list[DeviceProfile]) -> Table:
    """One row per profile: memory, the share a model can use, the fastest tier's bandwidth."""
    table = Table(title="Device profiles" if len(profiles) > 1 else None)
    table.add_column("id", no_wrap=True)
    table.add_column("name")
    table.add_column("total", justify="right", no_wrap=True)
    table.add_column("usable", justify="right", no_wrap=True)
    table.add_column("unified", justify="center")
    table.add_column("bandwidth", justify="right", no_wrap=True)  # of the fastest tier
    table.add_column("kind", no_wrap=True)
    for p in profiles:
        table.add_row(
            p.id,
            p.name,
            format_bytes(p.total_memory_bytes),
            format_bytes(p.usable_bytes),
            "yes" if p.unified_memory else "no",
            f"{p.fastest_tier.bandwidth_gbps:g} GB/s",
            p.kind,
        )
    return table


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
