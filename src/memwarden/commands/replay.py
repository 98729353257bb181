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
        "--device",
        default=None,
        metavar="DEVICE",
        help="device index or name (default: the trace's primary device, as summary shows it)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--heatmap", metavar="OUT.png", help="also draw the memory layout over time to this PNG (- for stdout)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.commands._common import bytes_option, load_trace, pick_device, print_json, wrote
    from memwarden.plan.allocator.config import parse_alloc_conf
    from memwarden.plan.replay import replay
    from memwarden.trace.io import check_output

    if args.allocator not in ALLOCATORS:
        raise InputError(f"unknown --allocator {args.allocator!r} (choose from {', '.join(ALLOCATORS)})")
    limit = None if args.limit is None else bytes_option("--limit", args.limit)
    try:
        config = parse_alloc_conf(args.alloc_conf, limit_bytes=limit)
    except ValueError as exc:
        raise InputError(f"--alloc-conf: {exc}") from None
    if args.heatmap:
        check_output(args.heatmap, flag="--heatmap", allow_stdout=not args.json)
    trace = load_trace(args.file)
    device = pick_device(trace, args.device)
    result = replay(trace, config, device, allocator=args.allocator, history_columns=400 if args.heatmap else 0)
    if args.heatmap:
        from memwarden.report.heatmap import render_heatmap

        if result.history is None or not result.history.blocks:
            raise InputError(f"--heatmap: nothing to draw: {trace.devices[device]!r} has no allocations in this trace")

        try:
            times_s = (trace.events["time_us"] - trace.events["time_us"][0]) / 1e6
            render_heatmap(result, args.heatmap, times_s=times_s)
        except OSError as exc:
            raise InputError(f"--heatmap: cannot write {args.heatmap} ({exc.strerror or exc})") from None
    if args.json:
        print_json(result.to_json())
        return 0
    if args.heatmap == "-":
        wrote(args.heatmap)
        return 0  # stdout carries the PNG
    from rich.console import Console

    from memwarden.report.allocators import replay_table

    Console().print(replay_table(result, source=args.file, device_name=trace.devices[device], trace=trace))
    if args.heatmap:
        wrote(args.heatmap)
    return 0
