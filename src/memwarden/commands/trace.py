"""memwarden trace [-o FILE] SCRIPT.py [ARGS...]: run a script as __main__ under capture."""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from memwarden.errors import InputError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "trace",
        help="run a Python script under capture and save its trace",
        description="Run SCRIPT as __main__ with every allocation recorded. If the script fails, the trace up "
        "to the failure is still saved and the script's exit status is passed on.",
    )
    p.add_argument("-o", "--output", default="memwarden.mwtrace", help="trace file to write (default: %(default)s)")
    p.add_argument("script", help="Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    script = Path(args.script)
    if not script.is_file():
        raise InputError(f"{args.script}: no such script")
    if not os.access(script, os.R_OK):
        raise InputError(f"{args.script}: not readable")
    out = Path(args.output)
    if out.parent and not out.parent.exists():
        raise InputError(f"{args.output}: directory {out.parent} does not exist")

    from memwarden.capture.live.capture import Capture
    from memwarden.trace.io import save

    status = 0
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [str(script), *args.args]
    sys.path.insert(0, str(script.resolve().parent))
    cap = Capture(metadata={"script": str(script), "argv": list(args.args)})
    try:
        with cap:
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
    except KeyboardInterrupt:
        status = 130
    except BaseException:
        # The script's own failure: show its traceback as Python would, keep the trace.
        etype, value, tb = sys.exc_info()
        target = str(script.resolve())
        while tb is not None and str(Path(tb.tb_frame.f_code.co_filename).resolve()) != target:
            tb = tb.tb_next  # drop memwarden's and runpy's frames above the script
        traceback.print_exception(etype, value, tb)
        status = 1
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path and sys.path[0] == str(script.resolve().parent):
            sys.path.pop(0)
    trace = cap.trace
    if trace is None:
        raise InputError("capture produced no trace")
    trace.metadata["exit_status"] = status
    save(trace, out)
    from memwarden.analyze.analysis import Analysis
    from memwarden.units import format_bytes

    s = Analysis(trace).summary
    state = "completed" if status == 0 else f"failed (exit status {status}); trace saved up to the failure"
    print(
        f"memwarden: {script.name} {state}. Wrote {out}: {s.events:,} events, peak {format_bytes(s.peak_bytes)}, "
        f"weights {format_bytes(s.weights_bytes)}",
        file=sys.stderr,
    )
    return status
