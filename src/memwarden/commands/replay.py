"""memwarden replay FILE [--allocator pytorch|pytorch-expandable|arena] [--limit BYTES] [--alloc-conf CONF] [--json] [--heatmap OUT.png]"""

from __future__ import annotations

import argparse
from typing import Any

from memwarden.errors import InputError

ALLOCATORS = ("pytorch", "pytorch-expandable", "arena")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a trace through PyTorch's caching-allocator model (or a static arena)",
        description=(
            "Replay the allocations of a trace through a model of PyTorch's CUDA caching allocator and report "
            "peak reserved memory, fragmentation at that peak, retries and the first OOM under a limit."
        ),
    )
    p.add_argument("file", metavar="FILE", help=".mwtrace file or PyTorch memory snapshot pickle")
    p.add_argument(
        "--allocator",
        default="pytorch",
        metavar="{" + ",".join(ALLOCATORS) + "}",
        help="allocator model (default: pytorch; pytorch-expandable = expandable_segments:True; "
        "arena = the static arena plan)",
    )
    p.add_argument(
        "--limit",
        metavar="BYTES",
        help="memory the allocator may reserve, e.g. 6GiB, 512MiB, 2GB (SI) or plain bytes; default unlimited",
    )
    p.add_argument(
        "--alloc-conf",
        metavar="CONF",
        default="",
        help='PYTORCH_CUDA_ALLOC_CONF settings, e.g. "max_split_size_mb:128,roundup_power2_divisions:4"',
    )
    p.add_argument(
        "--device", default=None, metavar="DEVICE", help="device index or name (default: the first with allocations)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--heatmap", metavar="OUT.png", help="also draw the memory layout over time to this PNG")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.commands._common import load_trace, print_json
    from memwarden.plan.allocator.config import parse_alloc_conf
    from memwarden.plan.replay import replay
    from memwarden.units import parse_bytes

    if args.allocator not in ALLOCATORS:
        raise InputError(f"unknown --allocator {args.allocator!r} (choose from {', '.join(ALLOCATORS)})")
    limit = None
    if args.limit is not None:
        try:
            limit = parse_bytes(args.limit)
        except ValueError as exc:
            raise InputError(f"--limit: {exc}") from None
    try:
        config = parse_alloc_conf(args.alloc_conf, limit_bytes=limit)
    except ValueError as exc:
        raise InputError(f"--alloc-conf: {exc}") from None
    trace = load_trace(args.file)
    device = pick_device(trace, args.device)
    result = replay(trace, config, device, allocator=args.allocator, history_columns=400 if args.heatmap else 0)
    if args.heatmap:
        from memwarden.report.heatmap import render_heatmap

        try:
            render_heatmap(result, args.heatmap)
        except OSError as exc:
            raise InputError(f"--heatmap: cannot write {args.heatmap} ({exc.strerror or exc})") from None
    if args.json:
        print_json(result.to_json())
        return 0
    _print_table(args, trace, device, result)
    return 0


def pick_device(trace: Any, wanted: str | None) -> int:
    """A device index from ``--device`` (index or name), else the first device that allocates."""
    import numpy as np

    from memwarden.trace.model import Action

    if wanted is None:
        allocating = np.isin(trace.events["action"], [Action.ALLOC, Action.PREEXISTING])
        devices = trace.events["device"][allocating]
        return int(devices.min()) if len(devices) else 0
    if wanted in trace.devices:
        return int(trace.devices.index(wanted))
    try:
        index = int(wanted)
    except ValueError:
        index = -1
    if not 0 <= index < len(trace.devices):
        raise InputError(f"--device {wanted!r} is not in this trace (devices: {', '.join(trace.devices)})")
    return index


def _print_table(args: argparse.Namespace, trace: Any, device: int, result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    from memwarden.units import format_bytes

    settings = result.config.to_alloc_conf() or "defaults"
    if result.config.limit_bytes is not None:
        settings += f", limit {format_bytes(result.config.limit_bytes)}"
    table = Table(title=f"{args.file}: {trace.devices[device]} through the {result.allocator} allocator model")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("settings", settings if result.allocator != "arena" else "static arena plan")
    table.add_row("peak allocated", format_bytes(result.peak_allocated_bytes))
    table.add_row("peak reserved", format_bytes(result.peak_reserved_bytes))
    table.add_row("fragmentation at reserved peak", f"{result.fragmentation:.1%}")
    table.add_row("reserved but unallocated at peak", format_bytes(result.reserved_unallocated_at_peak_bytes))
    table.add_row("largest free block at peak", format_bytes(result.largest_free_block_at_peak_bytes))
    table.add_row("segments at peak", str(result.segments_at_peak))
    table.add_row("allocation retries (cache flushes)", str(result.num_alloc_retries))
    oom = "none" if result.oom_at_event is None else f"event {result.oom_at_event}"
    table.add_row("out of memory", oom)
    console = Console()
    console.print(table)
    if args.heatmap:
        console.print(f"heatmap written to {args.heatmap}")
