"""`memwarden export FILE --format torch-snapshot|chrome -o OUT`: hand a trace to other viewers.

torch-snapshot: PyTorch's memory snapshot pickle, for ``python -m
torch.cuda._memory_viz`` and pytorch.org/memory_viz. With ``--allocator`` the
segments come from replaying the trace through memwarden's model of the CUDA
caching allocator, so the viewer shows reserved memory and fragmentation.
chrome: trace-event JSON for ui.perfetto.dev or chrome://tracing.

Choices are checked here rather than by argparse so that a wrong one is one
line on stderr, like every other user error.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from memwarden.errors import InputError
from memwarden.trace.model import Action

FORMATS = ("torch-snapshot", "chrome")
ALLOCATORS = ("pytorch", "pytorch-expandable")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a trace as a PyTorch memory snapshot or Chrome/Perfetto JSON",
        description="Write a trace as a PyTorch memory snapshot (for torch.cuda._memory_viz) or Chrome/Perfetto JSON.",
    )
    parser.add_argument("file", metavar="FILE", help="a .mwtrace file or a PyTorch memory snapshot")
    parser.add_argument("--format", required=True, metavar="{" + ",".join(FORMATS) + "}", help="output format")
    parser.add_argument(
        "-o", "--output", required=True, metavar="OUT", help="file to write (replaced atomically); - for stdout"
    )
    parser.add_argument(
        "--allocator",
        metavar="{" + ",".join(ALLOCATORS) + "}",
        help="torch-snapshot only: take segments from a replay through this allocator model",
    )
    parser.set_defaults(func=run)


def _replay_segments(trace: Any, allocator: str) -> list[dict[str, Any]]:
    """Segments at the end of a replay of each device through memwarden's caching-allocator model."""
    from memwarden.interop.snapshot_export import device_indices
    from memwarden.plan.allocator.config import AllocatorConfig
    from memwarden.plan.replay import replay

    config = AllocatorConfig(expandable_segments=allocator == "pytorch-expandable")
    index_of = device_indices(trace.devices)
    segments: list[dict[str, Any]] = []
    allocations = np.isin(trace.events["action"], [Action.ALLOC, Action.PREEXISTING, Action.FREE])
    for device in sorted(set(trace.events["device"][allocations].tolist())):
        for segment in replay(trace, config, device=device).segments_at_end_snapshot:
            segments.append({**segment, "device": index_of[device]})  # the model numbers devices as the trace does
    return segments


def run(args: argparse.Namespace) -> int:
    if args.format not in FORMATS:
        raise InputError(f"unknown --format {args.format!r} (choose from {', '.join(FORMATS)})")
    if args.allocator is not None:
        if args.allocator not in ALLOCATORS:
            raise InputError(f"unknown --allocator {args.allocator!r} (choose from {', '.join(ALLOCATORS)})")
        if args.format != "torch-snapshot":
            raise InputError("--allocator applies only to --format torch-snapshot")

    from memwarden.commands._common import wrote
    from memwarden.interop.files import load_any
    from memwarden.trace.io import check_output

    check_output(args.output, flag="-o")
    trace = load_any(args.file)
    try:
        if args.format == "chrome":
            from memwarden.interop.chrome import save_chrome

            save_chrome(trace, args.output)
        else:
            from memwarden.interop.snapshot import save_snapshot

            if args.allocator is None:
                save_snapshot(trace, args.output)
            else:
                settings = {"expandable_segments": args.allocator == "pytorch-expandable"}
                segments = _replay_segments(trace, args.allocator)
                save_snapshot(trace, args.output, segments, allocator_settings=settings)
    except OSError as exc:
        raise InputError(f"cannot write {args.output}: {exc.strerror or exc.__class__.__name__}") from None
    wrote(args.output, f"{args.format}, {trace.num_events} events, {trace.num_spans} spans")
    return 0
