"""The traced process of ``memwarden trace``: ``python -m memwarden.record.live.child --stream
PATH [--options JSON] (SCRIPT | -m MODULE) [ARGS...]`` runs the script (or module, as ``python -m`` does) as
``__main__`` under a streaming capture and exits with the script's status.

The capture streams to PATH as it runs; if the script ends (normally, by an exception,
``sys.exit`` or Ctrl-C) the capture stops and PATH becomes the complete trace; if the process is
killed, PATH keeps every chunk flushed before, for the supervisor to finish. With the option
``ring_file`` every recorder row is also copied as it is logged into that mapped file (the crash
ring), from which the supervisor takes the rows logged after the last chunk.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _failure(exc: BaseException) -> dict[str, Any] | None:
    """A memory failure the supervisor explains: MemoryError, torch.OutOfMemoryError."""
    names = {c.__name__ for c in type(exc).__mro__}
    if "MemoryError" in names or "OutOfMemoryError" in names:
        return {"kind": type(exc).__name__, "message": str(exc)[:500]}
    return None


def _print_script_traceback(target: str | None) -> None:
    etype, value, tb = sys.exc_info()
    if target is not None:
        while tb is not None and str(Path(tb.tb_frame.f_code.co_filename).resolve()) != target:
            tb = tb.tb_next  # drop memwarden's and runpy's frames above the script
    traceback.print_exception(etype, value, tb)


# The crash ring's size (native.cpp's ring_attach): rows logged since the stream's last chunk are
# recovered while fewer than RING_ROWS were logged after them (~1.3 M rows a second between two
# 100 ms flushes); its pages are touched as rows arrive, 9 MiB at most (64 + 8 bytes a row), plus
# the side area for the op names, source lines and shapes interned since.
RING_ROWS = 1 << 17
RING_SIDE_BYTES = 4 << 20


def _attach_ring(path: str, rows: int) -> None:
    from memwarden.record import native

    try:
        attach = getattr(native.load(), "ring_attach", None)
        if attach is not None:
            attach(path, rows, RING_SIDE_BYTES)
    except native.NativeUnavailable:
        return  # the capture says so in its own warning, as it falls back to the Python recorder
    except Exception as exc:  # a missing /dev/shm must not stop the run: the stream alone remains
        print(f"memwarden: no crash ring ({exc}); a crash loses the rows since the last flush", file=sys.stderr)


def run(
    stream: str, script: str | None, module: str | None, args: list[str], options: dict[str, Any] | None = None
) -> int:
    from memwarden.record.live.capture import Capture
    from memwarden.record.live.stream import Streamer

    Streamer.detail_every = 0  # the supervisor reads this process's smaps_rollup from outside
    if module is not None:
        sys.argv = [module, *args]
        sys.path.insert(0, os.getcwd())
        target = None
    else:
        assert script is not None
        sys.argv = [script, *args]
        sys.path.insert(0, str(Path(script).resolve().parent))
        target = str(Path(script).resolve())
    # cwd: the folder the script's relative source paths are read from (diagnose follows its lines)
    meta: dict[str, Any] = {
        "script": script if module is None else f"-m {module}",
        "argv": list(args),
        "cwd": os.getcwd(),
    }
    opts = dict(options or {})
    if isinstance(opts.get("sink"), dict):  # trace --sink: where this run's trace is also sent
        meta["sink"] = opts["sink"]
    cap = Capture(
        metadata=meta,
        stream_to=stream,
        stacks=bool(opts.get("stacks")),
        user_code=opts.get("user_code") or None,
        library_code=opts.get("library_code") or None,
        ring_s=opts.get("ring_s"),
        ring_rss_bytes=opts.get("ring_rss_bytes"),
    )
    if opts.get("ring_file"):  # the supervisor reads it after this process, however it ends
        _attach_ring(str(opts["ring_file"]), int(opts.get("ring_rows") or RING_ROWS))
    status = 0
    try:
        with cap:
            if module is not None:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(script or "", run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
    except KeyboardInterrupt:
        status = 130
    except BaseException as exc:
        _print_script_traceback(target)
        failure = _failure(exc)
        if failure is not None and cap.trace is not None:
            cap.trace.metadata["failure"] = failure
            from memwarden.trace.io import save

            save(cap.trace, stream)
        status = 1
    return status


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] != "--stream":
        print(
            "usage: python -m memwarden.record.live.child --stream PATH (SCRIPT | -m MODULE) [ARGS...]", file=sys.stderr
        )
        return 2
    stream, rest = argv[1], argv[2:]
    options: dict[str, Any] = {}
    if rest[0] == "--options" and len(rest) >= 3:  # JSON: stacks, user_code, library_code
        options, rest = json.loads(rest[1]), rest[2:]
    if rest[0] == "-m" and len(rest) >= 2:
        return run(stream, None, rest[1], rest[2:], options)
    return run(stream, rest[0], None, rest[1:], options)


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(status)
