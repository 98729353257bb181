"""The independent check of an ORT capture: its run peak against a measurement of the same run.

Measurements, each of the bytes ORT allocates during a run above what it held before (weights
and session state), the quantity ``run_peak_bytes`` reads off a capture:

- ORT's allocator counters (from the arena-on run, or its arena-on twin): the highest bytes
  requested and not released after any kernel (``ort_counter_peak``); the capture uses these
  counters to reconcile its replayed plan (``planner_hold``), so this check is not independent
  of it, only of the replay;
- a malloc-level counter (arena off, so every tensor is a malloc): ``mallocpeak``, a small
  library preloaded into a fresh subprocess (``python -m memwarden.record.onnx.measure``) that
  counts every byte the C library hands out and back; the peak over the measured
  ``session.run`` less what was live before it. Independent of the capture: it reads neither
  ORT's profile nor its counters. With the memory pattern on, the measured run is the session's
  second at the same shapes (``runs=2``), the first that uses the pattern;
- memray, where it is installed, the same way (its ``peak_memory`` of a tracked run);
- the resident set's high-water mark (``VmHWM`` after ``clear_refs``) in the same subprocess,
  coarse (pages, the C library's heap) and only meaningful for runs of many MiB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.errors import InputError
from memwarden.record.onnx import mallocpeak
from memwarden.record.onnx.feeds import save_feeds
from memwarden.record.onnx.session import OrtSettings
from memwarden.trace.model import Category, Trace
from memwarden.trace.steps import steps_of

__all__ = ["Measured", "measure_run", "ort_counter_peak", "ort_high_water", "ort_runs", "run_peak_bytes", "run_peaks"]


def _own_bytes(trace: Trace) -> np.ndarray:
    """Per event: signed bytes of what ORT itself holds (not the weights, not the caller's feeds)."""
    ev = trace.events
    ops = np.array([trace.string(int(i)) or "" for i in ev["op"]], dtype=object)
    own = (ev["category"] != Category.WEIGHT) & (ops != "feed")
    return np.where(own, trace.signed_bytes(), 0)


def run_peak_bytes(trace: Trace) -> int:
    """Highest bytes ORT itself holds during any run of an ORT capture: everything but the
    weights and the caller's feeds."""
    return int(np.cumsum(_own_bytes(trace)).max(initial=0))


def run_peaks(trace: Trace) -> list[int]:
    """``run_peak_bytes`` per run (one per step of the capture, in order), each above what was held
    when the run began."""
    held = np.cumsum(_own_bytes(trace))
    times = trace.events["time_us"]
    out = []
    for step in steps_of(trace):
        inside = np.flatnonzero((times >= step.start_us) & (times <= step.end_us))
        if not len(inside):
            out.append(0)
            continue
        before = int(held[inside[0] - 1]) if inside[0] > 0 else 0
        out.append(max(0, int(held[inside].max()) - before))
    return out


def ort_runs(trace: Trace) -> list[dict[str, Any]]:
    ort = trace.metadata.get("onnxruntime")
    runs = ort.get("runs") if isinstance(ort, dict) else None
    return [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []


def ort_counter_peak(trace: Trace) -> int | None:
    """ORT's own figure for the same quantity, where its profile had allocator counters: the
    highest bytes requested and not yet released after any kernel, less those held when the run
    began (in-kernel scratch that is gone by the kernel's end is not in it)."""
    values = [
        int(r["arena_in_use_peak_bytes"]) - int(r["arena_in_use_before_bytes"])
        for r in ort_runs(trace)
        if isinstance(r.get("arena_in_use_peak_bytes"), int) and isinstance(r.get("arena_in_use_before_bytes"), int)
    ]
    return max(values) if values else None


def ort_high_water(trace: Trace) -> int | None:
    """The arena's high-water mark above the run's start: chunks, so rounded up (BFC hands out a
    whole free chunk unless it is at least twice the request), scratch included."""
    values = [
        int(r["arena_high_water_bytes"]) for r in ort_runs(trace) if isinstance(r.get("arena_high_water_bytes"), int)
    ]
    return max(values) if values else None


@dataclass(frozen=True)
class Measured:
    """A subprocess run's peaks above the state before ``run`` (bytes)."""

    malloc_peak_bytes: int | None  # None where the counter cannot be built (not Linux/glibc, no compiler)
    memray_peak_bytes: int | None  # None where memray is not installed
    rss_peak_bytes: int


def measure_run(
    model: str | Path, feeds: dict[str, np.ndarray], settings: OrtSettings, *, runs: int = 1, timeout_s: float = 300
) -> Measured:
    """Run ``model`` ``runs`` times on ``feeds`` in one session of a fresh interpreter and measure
    the last run's peak (``runs=2`` measures the first run that uses ORT's memory pattern)."""
    if runs < 1:
        raise InputError("runs must be at least 1")
    with tempfile.TemporaryDirectory(prefix="memwarden-measure-") as tmp:
        feeds_path = Path(tmp) / "feeds.npz"
        save_feeds(feeds_path, feeds)
        config = {
            "model": str(model),
            "feeds": str(feeds_path),
            "work": tmp,
            "arena": settings.arena,
            "mem_pattern": settings.mem_pattern,
            "optimization": settings.optimization,
            "runs": runs,
        }
        env = dict(os.environ)
        library = mallocpeak.build()
        if library is not None:
            env["LD_PRELOAD"] = " ".join(p for p in (str(library), env.get("LD_PRELOAD", "")) if p)
            env[mallocpeak.ENV] = str(library)
        done = subprocess.run(
            [sys.executable, "-m", "memwarden.record.onnx.measure", json.dumps(config)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=env,
        )
        if done.returncode != 0:
            raise InputError(f"measurement run failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
    return Measured(
        malloc_peak_bytes=result.get("malloc"),
        memray_peak_bytes=result.get("memray"),
        rss_peak_bytes=int(result["rss"]),
    )


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _child(config: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime as ort

    from memwarden.record.onnx.feeds import load_feeds

    settings = OrtSettings(
        arena=bool(config["arena"]), mem_pattern=bool(config["mem_pattern"]), optimization=str(config["optimization"])
    )
    session = ort.InferenceSession(str(config["model"]), settings.session_options(), providers=settings.providers())
    feeds = load_feeds(config["feeds"])
    warm = int(config.get("runs", 1)) - 1
    out: dict[str, Any] = {"malloc": None}
    if os.environ.get(mallocpeak.ENV):  # the counter is preloaded: each session is measured on its last run
        for _ in range(warm):
            session.run(None, feeds)
        before = mallocpeak.reset_peak()
        results = session.run(None, feeds)
        out["malloc"] = max(0, mallocpeak.read_peak() - before)
        del results
        session = ort.InferenceSession(str(config["model"]), settings.session_options(), providers=settings.providers())
    try:
        import memray
    except ImportError:
        out["memray"] = None
    else:
        for _ in range(warm):
            session.run(None, feeds)
        path = Path(config["work"]) / "run.bin"
        with memray.Tracker(str(path), native_traces=False):
            results = session.run(None, feeds)
            del results
        out["memray"] = int(memray.FileReader(str(path)).metadata.peak_memory)
        session = ort.InferenceSession(str(config["model"]), settings.session_options(), providers=settings.providers())
    for _ in range(warm):
        session.run(None, feeds)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status_kib("VmRSS")
    results = session.run(None, feeds)
    out["rss"] = max(0, _status_kib("VmHWM") - before)
    return out


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
