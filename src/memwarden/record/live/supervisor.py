"""``memwarden trace``'s supervisor: runs the script in a child process and writes its trace
however the child ends.

The supervisor imports neither torch nor the script's libraries, so it stays small (an OOM
killer that picks the biggest process picks the script). The child (``capture.live.child``)
streams its capture to the output file as it runs; the supervisor samples the child's resident
memory every 100 ms and waits. When the child has ended:

- it stopped its capture (normal exit, exception, ``sys.exit``, Ctrl-C): the file holds the
  complete trace;
- it was killed (SIGKILL, SIGABRT, SIGSEGV, ``os._exit``, the OOM killer): the file holds the
  stream up to the last flush, and the crash ring (a file the child maps, in a folder this
  supervisor makes and removes) every row the recorder logged after it; ``recover_ring`` appends
  those and ``attribute_stream`` turns the whole into the trace. ``metadata.lost_events`` counts
  rows the child recorded that neither holds (0 unless the ring overflowed between two flushes;
  None where no ring could be read).

With ``options["sink"]`` (``trace --sink ADDR``) a ``sink.Forwarder`` sends the stream out as it
grows and the complete trace at the end, so a kill of the whole container leaves the trace outside.

Either way the supervisor adds what only it knows (``metadata.exit_status``, ``exit_signal``,
``oom_killed``, the resident samples and the last resident size it saw) and writes the
``.mwtrace`` atomically over the stream.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from memwarden.record.live.oom import KernelLog, OomCounters, oom_evidence, oom_killed
from memwarden.record.live.recover import RingRecovery, attribute_stream, recover_ring
from memwarden.record.live.rss import sample
from memwarden.record.live.sink import Forwarder
from memwarden.record.live.wire import SinkAddress
from memwarden.trace.format import FORMAT_MAGIC, loads
from memwarden.trace.io import save
from memwarden.trace.model import Trace, TraceBuilder, TraceFormatError
from memwarden.trace.stream import STREAM_MAGIC, read_stream, trace_from_stream

__all__ = ["OomCounters", "SupervisedRun", "reconcile", "resident_metadata", "supervise"]

SAMPLE_INTERVAL_S = 0.1


@dataclass
class SupervisedRun:
    trace: Trace
    status: int  # the script's exit status; 128 + signal for a signal
    exit_signal: int | None
    recovered: bool  # the trace came from the stream (the child did not stop its capture)
    samples: list[dict[str, int]] = field(default_factory=list)
    sink_lines: list[str] = field(default_factory=list)  # what the sink said (trace --sink)


def resident_metadata(samples: list[dict[str, int]], t0_ns: int) -> dict[str, Any]:
    """The ``metadata.resident`` of a trace: samples as columns, time in trace microseconds."""
    # Samples before the capture started (the interpreter importing torch) are not the run's.
    samples = sorted((s for s in samples if "rss" in s and s["t_ns"] >= t0_ns), key=lambda s: s["t_ns"])
    if not samples:
        return {}
    cols: dict[str, list[int | None]] = {"time_us": [max(0, (s["t_ns"] - t0_ns) // 1000) for s in samples]}
    for key in ("rss", "pss", "anon", "file"):
        if any(key in s for s in samples):
            cols[key] = [s.get(key) for s in samples]
    return {
        "interval_ms": int(SAMPLE_INTERVAL_S * 1000),
        "samples": cols,
        "last_bytes": samples[-1]["rss"],
        "peak_bytes": max(s["rss"] for s in samples),
    }


def reconcile(resident: dict[str, Any], trace: Trace) -> None:
    """Traced live bytes at each resident sample, and the difference as ``not_traced`` (native
    libraries, allocator caches, the interpreter): ``samples.traced``/``samples.not_traced`` and
    ``not_traced_last_bytes``."""
    cols = resident["samples"]
    times = np.asarray(cols["time_us"], dtype=np.int64)
    live = trace.live_bytes()
    at = np.searchsorted(trace.events["time_us"], times, side="right") - 1
    traced = np.where(at >= 0, live[np.maximum(at, 0)] if len(live) else 0, 0).astype(np.int64)
    rss = np.asarray(cols["rss"], dtype=np.int64)
    cols["traced"] = traced.tolist()
    cols["not_traced"] = np.maximum(0, rss - traced).tolist()
    resident["not_traced_last_bytes"] = int(cols["not_traced"][-1]) if len(rss) else 0


def _read_output(path: Path) -> tuple[Trace | None, Any]:
    """(the complete trace the child wrote, or None; the stream log if it is a stream)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None, None
    if data.startswith(FORMAT_MAGIC):
        try:
            return loads(data), None
        except TraceFormatError:
            return None, None
    if data.startswith(STREAM_MAGIC):
        try:
            return None, read_stream(data)
        except ValueError:
            return None, None
    return None, None


def _child_command(
    script: str | None, module: str | None, args: list[str], stream: Path, options: dict[str, Any] | None = None
) -> list[str]:
    target = ["-m", module] if module is not None else [str(script)]
    extra = ["--options", json.dumps(options)] if options else []
    return [sys.executable, "-m", "memwarden.record.live.child", "--stream", str(stream), *extra, *target, *args]


def supervise(
    output: str | os.PathLike[str],
    *,
    script: str | None = None,
    module: str | None = None,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    options: dict[str, Any] | None = None,
) -> SupervisedRun:
    """Run the script (or ``-m`` module) traced in a child; write and return its trace.
    ``options["sink"]``: an address for ``SinkAddress.parse``; a sink that does not answer raises
    ``SinkError`` before the script runs."""
    out = Path(output)
    args = list(args or [])
    forwarder = None
    if (options or {}).get("sink"):
        name = Path(script).stem if module is None and script else str(module)
        forwarder = Forwarder(SinkAddress.parse(str((options or {})["sink"])), out, name)
        forwarder.check()
        options = {**(options or {}), "sink": forwarder.metadata()}
    ring_dir = Path(tempfile.mkdtemp(prefix="memwarden-ring-", dir=_ring_parent(out)))
    ring_file = ring_dir / "events.ring"
    try:
        return _supervise(
            out, script, module, args, env, {**(options or {}), "ring_file": str(ring_file)}, ring_file, forwarder
        )
    finally:
        shutil.rmtree(ring_dir, ignore_errors=True)


def _ring_parent(out: Path) -> str:
    """Where the crash ring lives: shared memory where there is some (no disk writes), else beside
    the output."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return str(shm)
    return str(out.resolve().parent)


def _supervise(
    out: Path,
    script: str | None,
    module: str | None,
    args: list[str],
    env: dict[str, str] | None,
    options: dict[str, Any],
    ring_file: Path,
    forwarder: Forwarder | None = None,
) -> SupervisedRun:
    before = OomCounters.read()
    kernel_log = KernelLog.open()  # before the child: only this run's lines count (oom.py)
    try:
        child = subprocess.Popen(_child_command(script, module, args, out, options), env=env)
    except BaseException:
        if kernel_log is not None:
            kernel_log.close()
        raise
    if forwarder is not None:
        forwarder.start()
    forwarded: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        forwarded.append(signum)
        try:
            child.send_signal(signum)
        except OSError:
            pass

    # Ctrl-C reaches the child too (same process group): it stops its capture and exits 130;
    # the supervisor keeps going so the trace gets written. SIGTERM/SIGHUP are passed on.
    passed_on = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    ring_s = (options or {}).get("ring_s")
    if ring_s:  # SIGUSR1 asks the flight recorder for its window (the child handles it)
        passed_on.append(signal.SIGUSR1)
    previous = {s: signal.signal(s, signal.SIG_IGN if s == signal.SIGINT else forward) for s in passed_on}
    # The flight recorder's bound holds here too: samples of about two windows.
    keep_samples = int(2 * float(ring_s) / SAMPLE_INTERVAL_S) + 1 if ring_s else 0
    samples: list[dict[str, int]] = []
    try:
        while True:
            try:
                returncode = child.wait(timeout=SAMPLE_INTERVAL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            got = sample(child.pid, detail=True)
            if got is not None and got["rss"] > 0:  # a zombie (exited, not yet reaped) reads 0
                samples.append(got)
                if keep_samples and len(samples) > 2 * keep_samples:
                    del samples[:-keep_samples]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    after = OomCounters.read()
    exit_signal = -returncode if returncode < 0 else None
    named = None
    if kernel_log is not None:
        named = kernel_log.killed(child.pid) if exit_signal == signal.SIGKILL else None
        kernel_log.close()
    status = 128 + exit_signal if exit_signal is not None else returncode
    trace, log = _read_output(out)
    recovered = trace is None
    lost_events: int | None = 0
    ring: RingRecovery | None = None
    if trace is None and log is not None:
        ring = recover_ring(log, ring_file)  # the rows logged after the stream's last chunk
        lost_events = ring.lost_events if ring is not None else None
        try:
            trace = attribute_stream(log)
        except Exception:  # attribution of a torn stream failed: keep every byte, attributed less
            trace = trace_from_stream(log)
        samples = [*log.resident, *samples]
        if ring is not None:
            trace.metadata.setdefault("recovered", log.recovery_note()).update(ring.note())
    if trace is None:  # the child died before its capture started (bad script, import error)
        trace = TraceBuilder(metadata={"script": script if module is None else f"-m {module}", "argv": args}).build()
    t0_ns = log.t0_ns if log is not None else int(trace.metadata.get("capture_t0_ns") or 0)
    meta = trace.metadata
    meta["exit_status"] = status
    meta["exit_signal"] = exit_signal
    meta["oom_killed"] = oom_killed(before, after, exit_signal, named)
    if exit_signal == signal.SIGKILL:
        meta["oom_evidence"] = oom_evidence(before, after, named)
    meta["supervised"] = True
    meta["lost_events"] = lost_events  # recorded by the child, in neither the stream nor the ring
    resident = resident_metadata(samples, t0_ns or (samples[0]["t_ns"] if samples else 0))
    if resident:
        reconcile(resident, trace)
        meta["resident"] = resident
        meta["resident_last_bytes"] = resident["last_bytes"]
    if forwarded:
        meta["forwarded_signals"] = forwarded
    if forwarder is not None:
        meta["sink"] = forwarder.metadata()
    save(trace, out)
    run = SupervisedRun(trace=trace, status=status, exit_signal=exit_signal, recovered=recovered, samples=samples)
    if forwarder is not None:
        answer = forwarder.finish(out)
        run.sink_lines = [f"memwarden: {line}" for line in [*forwarder.problems[:1], answer]]
    return run
