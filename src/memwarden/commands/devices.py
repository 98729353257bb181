"""memwarden devices [PROFILE] [--json]"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "devices",
        help="list device profiles: memory, the share a model can use, bandwidth",
        description=(
            "List the built-in device profiles, smallest usable memory first, or show one profile in full "
            "(a built-in id or your own .toml file, which is validated)."
        ),
    )
    p.add_argument("profile", nargs="?", metavar="PROFILE", help="a built-in id or a .toml profile to show in full")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.models.devices import list_profiles, load_profile

    one = getattr(args, "profile", None)
    profiles = [load_profile(one)] if one else list_profiles()
    if args.json:
        from memwarden.commands._common import print_json

        print_json({"devices": [p.to_json() for p in profiles]})
        return 0

    from rich.console import Console

    console = Console()
    console.print(_overview(profiles))
    if one:
        console.print(_details(profiles[0]))
    return 0


def _overview(profiles: list[Any]) -> Any:
    from rich.table import Table

    from memwarden.units import format_bytes

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


def _details(p: Any) -> Any:
    from rich.console import Group
    from rich.table import Table

    from memwarden.units import format_bytes

    tiers = Table(title="Memory tiers")
    for col in ("tier", "capacity", "bandwidth", "latency"):
        tiers.add_column(col, justify="left" if col == "tier" else "right")
    for t in p.tiers:
        tiers.add_row(t.name, format_bytes(t.capacity_bytes), f"{t.bandwidth_gbps:g} GB/s", _latency(t.latency_us))

    compute = Table(title="Compute (dense peak, TFLOPS / TOPS)")
    compute.add_column("engine")
    for dtype in ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4"):
        compute.add_column(dtype, justify="right")
    engines = [("main", p.compute.peak_tflops)] + [(u.name, u.peak_tflops) for u in p.compute.units]
    for name, rates in engines:
        compute.add_row(name, *(_rate(rates.get(d)) for d in ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")))

    lines = (
        f"reserved for the OS and others: {format_bytes(p.os_reserved_bytes)}\n"
        f"accelerators: {', '.join(p.compute.accelerators)}\n"
        f"telemetry: {', '.join(p.telemetry) or 'none'}\n"
        f"source: {p.source}"
    )
    return Group(tiers, compute, lines)


def _latency(us: float) -> str:
    from memwarden.units import format_us

    return f"{us * 1000:.0f} ns" if us < 1 else format_us(us)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
