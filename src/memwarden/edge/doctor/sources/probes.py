"""Asking a loaded library, in a subprocess with a deadline.

Some facts exist only once a library is loaded: the cuDNN torch actually finds, or whether an
ONNX Runtime provider starts. Importing torch costs seconds and a broken CUDA install can hang
or abort, so each question runs as ``python -c SCRIPT`` (our script, never a user's) and all run
at once under one deadline. A probe that overruns is the fact "timed out", not a wait.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any


def run(scripts: dict[str, str], timeout_s: float) -> dict[str, dict[str, Any]]:
    """name -> {"status": "ok", "result": ..., "stderr": ...} | {"status": "timed out" | "error", ...}."""
    started: dict[str, subprocess.Popen[str]] = {}
    out: dict[str, dict[str, Any]] = {}
    for name, script in scripts.items():
        try:
            started[name] = subprocess.Popen(
                [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        except OSError as exc:
            out[name] = {"status": "error", "error": f"cannot start a probe: {exc}"}
    deadline = time.monotonic() + timeout_s
    for name, proc in started.items():
        try:
            stdout, stderr = proc.communicate(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out[name] = {"status": "timed out", "timeout_s": timeout_s}
            continue
        last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
        try:
            out[name] = {"status": "ok", "result": json.loads(last), "stderr": stderr[-8000:]}
        except ValueError:
            tail = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {proc.returncode}"
            out[name] = {"status": "error", "error": tail[:500]}
    return out
