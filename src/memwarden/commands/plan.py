"""memwarden plan FILE [--strategy greedy-by-size|greedy-by-breadth|best] [--alignment BYTES] [--json]"""

from __future__ import annotations

import argparse
from typing import Any

from memwarden.errors import InputError

STRATEGIES = ("greedy-by-size", "greedy-by-breadth", "best")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="plan a static memory arena for a trace's tensors",
        description=(
            "Give every tensor of a trace a fixed offset in one arena (tensors that are never live together "
            "share bytes) and compare the arena with the lower bound and with no sharing at all."
        ),
    )
    p.add_argument("file", metavar="FILE", help=".mwtrace file or PyTorch memory snapshot pickle")
    p.add_argument(
        "--strategy",
        default="best",
        metavar="{" + ",".join(STRATEGIES) + "}",
        help="offset heuristic (default: best = run all, keep the smallest arena)",
    )
    p.add_argument("--alignment", default="64", metavar="BYTES", help="offset and size alignment (default 64)")
    p.add_argument(
        "--device",
        default=None,
        metavar="DEVICE",
        help="device index or name (default: the trace's primary device, as summary shows it)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON, with every tensor's offset")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.commands._common import load_trace, pick_device, print_json
    from memwarden.plan.arena.plan import plan_arena

    if args.strategy not in STRATEGIES:
        raise InputError(f"unknown --strategy {args.strategy!r} (choose from {', '.join(STRATEGIES)})")
    try:
        alignment = int(args.alignment)
    except ValueError:
        alignment = 0
    if alignment <= 0:
        raise InputError(f"--alignment must be a positive number of bytes, got {args.alignment!r}")
    trace = load_trace(args.file)
    device = pick_device(trace, args.device)
    plan = plan_arena(trace, args.strategy, alignment=alignment, device=device)
    if args.json:
        print_json(plan.to_json())
        return 0

    from rich.console import Console

    from memwarden.report.allocators import arena_table

    best_of_all = args.strategy == "best"
    Console().print(arena_table(plan, source=args.file, device_name=trace.devices[device], best_of_all=best_of_all))
    return 0
