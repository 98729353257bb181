"""The independent check of an ORT capture: its run peak against a measurement of the same run.

Three measurements, each of the bytes ORT allocates during a run above what it held before
(weights and session state), the quantity ``run_peak_bytes`` reads off a capture:

- ORT's allocator counters (from the arena-on run, or its arena-on twin): the highest bytes
  requested and not released after any kernel (``ort_counter_peak``); the capture uses these
  counters to reconcile its replayed plan (``planner_hold``), so this check is not independent
  of it, only of the replay;
- memray (arena off, so every tensor is a malloc): the peak of the bytes allocated during
  ``session.run`` in a fresh subprocess (``python -m memwarden.capture.onnx.measure``);
- the resident set's high-water mark (``VmHWM`` after ``clear_refs``) in the same subprocess,
  coarse (pages, the C library's heap) and only meaningful for runs of many MiB.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.capture.onnx.session import OrtSettings
from memwarden.errors import InputError
from memwarden.trace.model import Category, Trace

__all__ = ["Measured", "measure_run", "ort_counter_peak", "ort_high_water", "run_peak_bytes"]


def run_peak_bytes(trace: Trace) -> int:
    """Highest bytes ORT itself holds during any run of an ORT capture: everything but the
    weights and the caller's feeds."""
    ev = trace.events
    ops = np.array([trace.string(int(i)) or "" for i in ev["op"]], dtype=object)
    own = (ev["category"] != Category.WEIGHT) & (ops != "feed")
    signed = np.where(own, trace.signed_bytes(), 0)
    return int(np.cumsum(signed).max(initial=0))


def _runs(trace: Trace) -> list[dict[str, Any]]:
    ort = trace.metadata.get("onnxruntime")
    runs = ort.get("runs") if isinstance(ort, dict) else None
    return [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []


def ort_counter_peak(trace: Trace) -> int | None:
    """ORT's own figure for the same quantity, where its profile had allocator counters: the
    highest bytes requested and not yet released after any kernel, less those held when the run
    began (in-kernel scratch that is gone by the kernel's end is not in it)."""
    values = [int(r["arena_in_use_peak_bytes"]) - int(r["arena_in_use_before_bytes"]) for r in _runs(trace)
              if isinstance(r.get("arena_in_use_peak_bytes"), int) and isinstance(r.get("arena_in_use_before_bytes"), int)]  # fmt: skip
    return max(values) if values else None


def ort_high_water(trace: Trace) -> int | None:
    """The arena's high-water mark above the run's start: chunks, so rounded up (BFC hands out a
    whole free chunk unless it is at least twice the request), scratch included."""
    values = [
        int(r["arena_high_water_bytes"]) for r in _runs(trace) if isinstance(r.get("arena_high_water_bytes"), int)
    ]
    return max(values) if values else None


@dataclass(frozen=True)
class Measured:
    """A subprocess run's peaks above the state before ``run`` (bytes)."""

    memray_peak_bytes: int | None  # None where memray is not installed
    rss_peak_bytes: int


def measure_run(
    model: str | Path, feeds: dict[str, np.ndarray], settings: OrtSettings, timeout_s: float = 300
) -> Measured:
    """Run ``model`` once on ``feeds`` in a fresh interpreter and measure the run's peak."""
    with tempfile.TemporaryDirectory(prefix="memwarden-measure-") as tmp:
        feeds_path = Path(tmp) / "feeds.npz"
        np.savez(feeds_path, **feeds)  # type: ignore[arg-type]
        config = {"model": str(model), "feeds": str(feeds_path), "work": tmp, "arena": settings.arena,
                  "mem_pattern": settings.mem_pattern, "optimization": settings.optimization}  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "memwarden.capture.onnx.measure", json.dumps(config)],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise InputError(f"measurement run failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
    return Measured(memray_peak_bytes=result.get("memray"), rss_peak_bytes=int(result["rss"]))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _child(config: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime as ort

    from memwarden.capture.onnx.session import load_feeds

    settings = OrtSettings(arena=bool(config["arena"]), mem_pattern=bool(config["mem_pattern"]),
                           optimization=str(config["optimization"]))  # fmt: skip
    session = ort.InferenceSession(str(config["model"]), settings.session_options(), providers=settings.providers())
    feeds = load_feeds(config["feeds"])
    out: dict[str, Any] = {}
    try:
        import memray
    except ImportError:
        out["memray"] = None
    else:
        path = Path(config["work"]) / "run.bin"
        with memray.Tracker(str(path), native_traces=False):
            results = session.run(None, feeds)
            del results
        out["memray"] = int(memray.FileReader(str(path)).metadata.peak_memory)
    session = ort.InferenceSession(str(config["model"]), settings.session_options(), providers=settings.providers())
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status_kib("VmRSS")
    results = session.run(None, feeds)
    out["rss"] = max(0, _status_kib("VmHWM") - before)
    return out


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
