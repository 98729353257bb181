"""A profiled ORT session in a child process with a time and memory limit of its own.

A model with control flow that has no bound (a ``Loop`` whose trip count is an input, or a
constant of ``2**62``: ``guard.ModelCheck.unbounded``) can run for ever or grow without end, and
nothing inside ``session.run`` can be interrupted from Python. Such a run happens here instead: a
fresh interpreter (``python -m memwarden.record.onnx.bounded_child``, its own process group) with
``RLIMIT_AS`` set to what it holds after start-up plus ``RunLimits.memory_bytes`` and a wall-clock
limit of ``RunLimits.seconds``, after which its whole group is killed. The child writes only into
the caller's work folder, which the caller removes on every exit. Either limit reached is one
``InputError`` naming the control-flow nodes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.errors import InputError
from memwarden.untrusted import terminal_safe

__all__ = ["DEFAULT_MEMORY_BYTES", "DEFAULT_SECONDS", "RunLimits", "run_bounded"]

DEFAULT_SECONDS = 4.0
DEFAULT_MEMORY_BYTES = 512 * 1024**2


@dataclass(frozen=True)
class RunLimits:
    """Limits for a run of a model with unbounded control flow (``why``: its nodes, for the error)."""

    seconds: float = DEFAULT_SECONDS
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    why: str = "control flow without a bound"


def run_bounded(
    source: str | Path | bytes,
    feeds: Sequence[Mapping[str, np.ndarray]],
    settings: Any,
    workdir: Path,
    prefix: str,
    *,
    optimized: bool,
    limits: RunLimits,
) -> tuple[Path, list[str]]:
    """``session._profiled_session`` in a limited child: (profile path, output names)."""
    from memwarden.record.onnx.feeds import save_feeds

    child = workdir / f"bounded-{prefix}"
    child.mkdir(exist_ok=True)
    if isinstance(source, bytes):
        model = child / "model.onnx"
        model.write_bytes(source)
    else:
        model = Path(source).resolve()
    paths = []
    for i, f in enumerate(feeds):
        paths.append(str(child / f"feeds{i}.npz"))
        save_feeds(paths[-1], f)
    config = {
        "model": str(model),
        "feeds": paths,
        "settings": asdict(settings),
        "workdir": str(workdir),
        "prefix": prefix,
        "optimized": optimized,
        "memory_bytes": int(limits.memory_bytes),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "memwarden.record.onnx.bounded_child", json.dumps(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=limits.seconds)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise InputError(
            f"the model's {limits.why} did not finish within {limits.seconds:g} s, the time limit for control "
            "flow without a bound (raise it with --loop-timeout)"
        ) from None
    except BaseException:
        _kill(proc)
        raise
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = next((line for line in reversed(err.strip().splitlines()) if line.strip()), f"exit {proc.returncode}")
        if "bad_alloc" in err or "MemoryError" in err or "memory limit" in last or proc.returncode < 0:
            raise InputError(
                f"the model's {limits.why} ran past {limits.memory_bytes:,} bytes, the memory limit for control "
                f"flow without a bound ({terminal_safe(last)[:200]})"
            )
        raise InputError(terminal_safe(last.removeprefix("memwarden: "))[:400])
    result = json.loads(lines[-1])
    return Path(result["profile"]), list(result["outputs"])


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.communicate()
