"""memwarden collect --listen ADDR -o DIR: keep the traces ``memwarden trace --sink ADDR`` sends."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from memwarden.commands._common import bytes_option
from memwarden.errors import InputError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "collect",
        help="receive traces sent by memwarden trace --sink, one file per run (survives a container kill)",
        description="Listen for memwarden trace --sink and write each run's trace to DIR/NAME-RUN.mwtrace as it "
        "arrives: while the run goes on, its stream (loadable up to the last chunk received); at a normal end, the "
        "complete trace. A container killed with its script leaves the trace here up to the kill. Loopback or a "
        "Unix socket only, unless --allow-remote (the protocol has no authentication). Runs until Ctrl-C.",
        epilog="example:\n  memwarden collect --listen 127.0.0.1:7433 -o traces/\n"
        "  memwarden trace --sink 127.0.0.1:7433 -o run.mwtrace train.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--listen", required=True, metavar="ADDR", help="HOST:PORT (port 0: any free one) or unix:PATH")
    p.add_argument("-o", "--output-dir", required=True, metavar="DIR", help="folder to write the runs' traces to")
    p.add_argument("--max-bytes", default="4GiB", metavar="BYTES", help="the most one run's part may hold (4GiB)")
    p.add_argument("--max-connections", type=int, default=64, metavar="N", help="clients served at once (64)")
    p.add_argument("--allow-remote", action="store_true", help="listen on an address other than loopback")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.record.live.collector import Collector
    from memwarden.record.live.wire import SinkAddress, SinkError

    try:
        address = SinkAddress.parse(args.listen, listening=True)
    except SinkError as exc:
        raise InputError(f"--listen {exc}") from None
    if not args.allow_remote and not address.is_loopback():
        raise InputError(f"--listen {args.listen}: not a loopback address; add --allow-remote to listen on a network")
    out = Path(args.output_dir)
    if not out.is_dir():
        raise InputError(f"-o {args.output_dir}: no such directory")
    max_bytes = bytes_option("--max-bytes", args.max_bytes)
    if max_bytes < 4096 or not 1 <= args.max_connections <= 10_000:
        raise InputError("--max-bytes must be at least 4096 and --max-connections 1..10000")
    collector = Collector(
        address,
        out,
        max_part_bytes=max_bytes,
        max_connections=args.max_connections,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    try:
        bound = collector.bind()
    except OSError as exc:
        raise InputError(f"--listen {args.listen}: cannot listen ({exc.strerror or exc})") from None

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(f"memwarden: collecting on {bound} into {out} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        collector.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        collector.shutdown()
    return 0
