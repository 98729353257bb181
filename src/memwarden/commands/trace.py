"""memwarden trace [-o FILE] SCRIPT.py [ARGS...]: run a script as __main__ under capture."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

from memwarden.commands._common import bytes_option
from memwarden.commands._onnx_trace import add_arguments as add_onnx_arguments
from memwarden.commands._onnx_trace import run as run_onnx
from memwarden.errors import InputError
from memwarden.trace.io import check_output


def register(sub: Any) -> None:
    p = sub.add_parser(
        "trace",
        help="run a Python script under capture and save its trace",
        description="Run SCRIPT as __main__ with every allocation recorded. The script runs in a child process "
        "that streams its trace as it goes, so if the script fails or is killed (an exception, SIGKILL, the OOM "
        "killer, a crash), the trace up to the failure is still saved and the script's exit status is passed on "
        "(128 + the signal for a signal).",
    )
    p.add_argument("-o", "--output", default="memwarden.mwtrace", help="trace file to write (default: %(default)s)")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script, as python -m does")
    add_onnx_arguments(p)
    p.add_argument(
        "--stacks",
        action="store_true",
        help="record the whole Python stack of every allocation (default: only the innermost line of your code)",
    )
    p.add_argument(
        "--user-code",
        action="append",
        default=[],
        metavar="PATH",
        help="count code under PATH as yours for source lines (repeatable; e.g. a library you are debugging)",
    )
    p.add_argument(
        "--library-code",
        action="append",
        default=[],
        metavar="PATH",
        help="never count code under PATH as yours for source lines (repeatable)",
    )
    p.add_argument(
        "--ring",
        type=float,
        metavar="SECONDS",
        help="flight recorder: keep only the last SECONDS "
        "(plus everything still alive when they began, such as weights) in bounded memory; the window "
        "is written when the script dies, on MemoryError, on SIGUSR1 and at --ring-rss",
    )
    p.add_argument(
        "--ring-rss",
        metavar="BYTES",
        help="with --ring: also write the window (as "
        "OUTPUT-STEM.rss-N.mwtrace) when resident memory first crosses BYTES, e.g. 6GiB",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="draw live bytes by category and modality, the phase and the top lines while the script runs",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve the script's live bytes by category and modality, peak and phase as Prometheus metrics "
        "on http://ADDR:PORT/metrics while it runs (0: any free port; the URL is printed)",
    )
    p.add_argument(
        "--metrics-addr", default="127.0.0.1", metavar="ADDR", help="address to serve metrics on (default: %(default)s)"
    )
    p.add_argument(
        "--sink",
        metavar="ADDR",
        help="also send the trace, as it is made, to a collector outside this machine's process tree "
        "(memwarden collect --listen ADDR): HOST:PORT, unix:PATH, or a directory (a mounted volume); a kill "
        "of the whole container then leaves the trace up to the kill there",
    )
    p.add_argument("script", nargs="?", help="Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "onnx", None):
        return run_onnx(args)
    if getattr(args, "module", None):
        return _run_module(args)
    if not args.script:
        raise InputError("give the Python script to run, e.g. memwarden trace -o run.mwtrace my_script.py --its-args")
    script = Path(args.script)
    if script.is_dir():
        raise InputError(f"{args.script}: is a directory; give the Python script to run (e.g. {script / 'main.py'})")
    if not script.is_file():
        raise InputError(f"{args.script}: no such script")
    if not os.access(script, os.R_OK):
        raise InputError(f"{args.script}: not readable")
    options = _options(args)  # flags checked before the script runs
    # The script's own output owns stdout, so the trace cannot go there; everything else about
    # the output is checked now, before the script runs, so a bad -o never costs the run.
    check_output(args.output, flag="-o", allow_stdout=False)
    out = Path(args.output)

    from memwarden.record.live.supervisor import supervise
    from memwarden.record.live.wire import SinkError

    metrics = _serve_metrics(args, out)
    try:
        if getattr(args, "live", False):
            from memwarden.commands._live_trace import run_live

            run_ = run_live(out, script=str(script), args=list(args.args), options=options)
        else:
            run_ = supervise(out, script=str(script), args=list(args.args), options=options)
    except SinkError as exc:  # raised before the script runs
        raise InputError(f"--sink: {exc}") from None
    finally:
        if metrics is not None:
            metrics.stop()
    return _report(script.name, out, run_.trace, getattr(run_, "sink_lines", []))


def _serve_metrics(args: argparse.Namespace, out: Path) -> Any:
    """``--metrics-port``: the exporter over the stream the child writes to ``out`` (or None)."""
    port = getattr(args, "metrics_port", None)
    if port is None:
        return None
    if not 0 <= port <= 65535:
        raise InputError(f"--metrics-port {port}: give a TCP port, 0-65535 (0: any free port)")
    from memwarden.commands._trace_metrics import StreamMetrics

    try:
        metrics = StreamMetrics(out).start(port, args.metrics_addr)
    except OSError as exc:
        raise InputError(
            f"--metrics-port {port}: cannot serve on {args.metrics_addr}:{port} ({exc.strerror or exc})"
        ) from None
    print(f"memwarden: serving metrics on {metrics.url}", file=sys.stderr, flush=True)
    return metrics


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """What the traced child's capture records beyond the defaults."""
    options: dict[str, Any] = {}
    if getattr(args, "stacks", False):
        options["stacks"] = True
    ring = getattr(args, "ring", None)
    if ring is not None:
        if not (ring > 0 and math.isfinite(ring)):
            raise InputError(f"--ring {ring}: give the window in seconds, e.g. --ring 30")
        options["ring_s"] = float(ring)
    if getattr(args, "ring_rss", None):
        if ring is None:
            raise InputError("--ring-rss needs --ring SECONDS (the window it writes)")
        options["ring_rss_bytes"] = bytes_option("--ring-rss", args.ring_rss)
    for key in ("user_code", "library_code"):
        if getattr(args, key, None):
            options[key] = [os.path.abspath(p) for p in getattr(args, key)]
    if getattr(args, "sink", None):
        from memwarden.record.live.wire import SinkAddress, SinkError

        try:
            address = SinkAddress.parse(args.sink)
        except SinkError as exc:
            raise InputError(f"--sink {exc}") from None
        # a directory by its absolute path: the supervisor may run elsewhere than the shell's cwd
        options["sink"] = os.path.abspath(address.path) if address.kind == "dir" else str(address)
    return options


def _report(name: str, out: Path, trace: Any, sink_lines: list[str] | None = None) -> int:
    from memwarden.analyze.analysis import Analysis
    from memwarden.analyze.postmortem import failure_lines, killed_lines
    from memwarden.units import format_bytes

    status = int(trace.metadata["exit_status"])
    s = Analysis(trace).summary
    state = "completed" if status == 0 else f"failed (exit status {status}); trace saved up to the failure"
    print(f"memwarden: {name} {state}.", file=sys.stderr)
    print(
        f"wrote {out} ({s.events:,} events, peak {format_bytes(s.peak_bytes)}, weights {format_bytes(s.weights_bytes)})",
        file=sys.stderr,
    )
    for line in failure_lines(trace) or killed_lines(trace):
        print(line, file=sys.stderr)
    for line in sink_lines or []:
        print(line, file=sys.stderr)
    return status


def _run_module(args: argparse.Namespace) -> int:
    """``memwarden trace -m MODULE [ARGS...]``: the module runs as ``python -m`` runs it."""
    check_output(args.output, flag="-o", allow_stdout=False)
    options = _options(args)
    from memwarden.record.live.supervisor import supervise
    from memwarden.record.live.wire import SinkError

    argv = ([args.script] if args.script else []) + list(args.args)
    try:
        run_ = supervise(Path(args.output), module=args.module, args=argv, options=options)
    except SinkError as exc:  # raised before the module runs
        raise InputError(f"--sink: {exc}") from None
    return _report(f"-m {args.module}", Path(args.output), run_.trace, run_.sink_lines)
