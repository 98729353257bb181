"""memwarden trace [-o FILE] SCRIPT.py [ARGS...]: run a script as __main__ under capture."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

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
    p.add_argument("script", nargs="?", help="Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
    # The script's own output owns stdout, so the trace cannot go there; everything else about
    # the output is checked now, before the script runs, so a bad -o never costs the run.
    check_output(args.output, flag="-o", allow_stdout=False)
    out = Path(args.output)

    from memwarden.capture.live.supervisor import supervise

    trace = supervise(out, script=str(script), args=list(args.args)).trace
    return _report(script.name, out, trace)


def _report(name: str, out: Path, trace: Any) -> int:
    from memwarden.analyze.analysis import Analysis
    from memwarden.analyze.postmortem import failure_lines
    from memwarden.units import format_bytes

    status = int(trace.metadata["exit_status"])
    s = Analysis(trace).summary
    state = "completed" if status == 0 else f"failed (exit status {status}); trace saved up to the failure"
    print(f"memwarden: {name} {state}.", file=sys.stderr)
    print(
        f"wrote {out} ({s.events:,} events, peak {format_bytes(s.peak_bytes)}, weights {format_bytes(s.weights_bytes)})",
        file=sys.stderr,
    )
    for line in failure_lines(trace):
        print(line, file=sys.stderr)
    return status


def _run_module(args: argparse.Namespace) -> int:
    """``memwarden trace -m MODULE [ARGS...]``: the module runs as ``python -m`` runs it."""
    check_output(args.output, flag="-o", allow_stdout=False)
    from memwarden.capture.live.supervisor import supervise

    argv = ([args.script] if args.script else []) + list(args.args)
    trace = supervise(Path(args.output), module=args.module, args=argv).trace
    return _report(f"-m {args.module}", Path(args.output), trace)
