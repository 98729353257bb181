"""``memwarden trace --onnx MODEL.onnx --inputs FEEDS.npz [--ep cpu] [--arena on|off]
[--mem-pattern on|off] -o X.mwtrace``: the ONNX Runtime path of ``memwarden trace``.

``trace`` adds these flags with ``add_arguments`` and hands over to ``run`` when ``--onnx`` is
given, before anything else of a script capture happens."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from memwarden.errors import InputError
from memwarden.trace.io import check_output

__all__ = ["add_arguments", "run"]


def add_arguments(p: Any) -> None:
    group = p.add_argument_group("ONNX Runtime capture (instead of a script)")
    group.add_argument(
        "--onnx", metavar="MODEL.onnx", help="capture an ONNX Runtime run of this model instead of a script"
    )
    group.add_argument("--inputs", metavar="FEEDS.npz", help="the model's inputs: one array per input name (.npz)")
    group.add_argument("--ep", default="cpu", choices=["cpu", "cuda"], help="execution provider (default: %(default)s)")
    group.add_argument(
        "--arena", default="on", choices=["on", "off"], help="ORT's CPU memory arena (default: %(default)s)"
    )
    group.add_argument(
        "--mem-pattern",
        default="on",
        choices=["on", "off"],
        help="ORT's memory pattern planning (default: %(default)s)",
    )
    group.add_argument(
        "--loop-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a model with control flow that has no bound (a Loop whose trip count is an input) "
        "may run, in a child process (default 4)",
    )
    group.add_argument(
        "--loop-memory", type=float, default=None, metavar="MIB", help="MiB such a run may allocate (default 512)"
    )
    group.add_argument(
        "--phase",
        choices=["encode", "prefill", "decode"],
        help="phase of the run (default: from the model's metadata and input names)",
    )


def run(args: argparse.Namespace) -> int:
    if args.script:
        raise InputError("give either --onnx MODEL.onnx or a script to run, not both")
    if not args.inputs:
        raise InputError("--onnx needs --inputs FEEDS.npz (one array per model input)")
    check_output(args.output, flag="-o", allow_stdout=False)
    from memwarden.record.onnx.bounded import DEFAULT_MEMORY_BYTES, DEFAULT_SECONDS, RunLimits
    from memwarden.record.onnx.capture import capture_onnx
    from memwarden.record.onnx.session import OrtSettings
    from memwarden.trace.io import save
    from memwarden.units import format_bytes
    from memwarden.untrusted import finite_float, terminal_safe

    seconds = (
        DEFAULT_SECONDS
        if args.loop_timeout is None
        else finite_float(args.loop_timeout, "--loop-timeout", lo=0.1, hi=86400)
    )
    memory = (
        DEFAULT_MEMORY_BYTES
        if args.loop_memory is None
        else int(finite_float(args.loop_memory, "--loop-memory", lo=16, hi=1 << 30) * 1024**2)
    )
    settings = OrtSettings(ep=args.ep, arena=args.arena == "on", mem_pattern=args.mem_pattern == "on")
    previous = signal.signal(signal.SIGTERM, _terminated)  # so that temporary folders are removed on the way out
    try:
        trace = capture_onnx(
            Path(args.onnx),
            Path(args.inputs),
            settings=settings,
            phase=args.phase,
            loop_limits=RunLimits(seconds, memory),
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    out = save(trace, args.output)
    peak = int(trace.live_bytes().max(initial=0))
    name = terminal_safe(Path(args.onnx).name)
    print(f"memwarden: {name} ran under ONNX Runtime ({settings.label()}).", file=sys.stderr)
    print(f"wrote {out} ({trace.num_events:,} events, peak {format_bytes(peak)})", file=sys.stderr)
    return 0


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
