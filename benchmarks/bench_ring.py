"""The flight recorder's own memory and per-event cost (``capture(ring_s=...)``).

A serving loop (a Linear layer's forward plus small temporaries per request) runs for
``--seconds`` under ``memwarden.capture(ring_s=--window, stream_to=tmp)``; reported: the most the
recorder's log held (``max_log_bytes``), the stream file's size at the end, events dropped, and
the thread CPU time per allocation of a tight ``torch.ones(16)`` loop untraced, under a plain streamed
capture, under a streamed capture with the crash ring attached (what ``memwarden trace``'s child
runs: every row also copied into a mapped file, native ``ring_attach``) and under the flight
recorder (interleaved, medians), and the crash ring's cost over the plain stream in percent.

    python benchmarks/bench_ring.py [--seconds 60] [--window 5] [--repeats 9] [--json]

``--callgrind``: the crash ring's cost in instructions, which a loaded machine does not change.
Each mode (untraced, streamed capture, streamed capture + crash ring) runs in its own process
under ``valgrind --tool=callgrind --instr-atstart=no``: the interpreter, torch and the capture
start uninstrumented, and a tiny helper (compiled here against ``valgrind/callgrind.h``) turns
counting on for exactly ``--allocations`` calls of ``torch.ones(16)`` after a warm-up, every
thread counted. The streamer's periodic flush is switched off in all modes (its count under
valgrind follows the wall clock, not the work; its per-row cost is the same with or without the
ring), so the figure is the allocating thread's own work: what the ring adds where it is paid.

    python benchmarks/bench_ring.py --callgrind [--allocations 20000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import memwarden
from memwarden.record import native
from memwarden.record.live.child import RING_ROWS, RING_SIDE_BYTES
from memwarden.record.live.supervisor import _ring_parent


def _tight(n: int) -> float:
    # The thread's CPU time, not wall: on a shared machine the steadier figure (the recorder's work
    # runs on this thread, under the allocator's call).
    start = time.thread_time()
    for _ in range(n):
        torch.ones(16)
    return (time.thread_time() - start) / n


_TOGGLE_C = """
#include <valgrind/callgrind.h>
void mw_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void mw_dump(void) { CALLGRIND_DUMP_STATS_AT("part"); }
void mw_stop(void) { CALLGRIND_DUMP_STATS_AT("loop"); CALLGRIND_STOP_INSTRUMENTATION; }
"""
CALLGRIND_MODES = ("untraced", "capture(stream_to)", "capture(stream_to)+crash ring")


def toggle_library(folder: str) -> str:
    """A shared library whose ``mw_start``/``mw_stop`` (ctypes) switch callgrind's counting on and
    off around a section, under ``valgrind --tool=callgrind --instr-atstart=no``."""
    src, lib = os.path.join(folder, "toggle.c"), os.path.join(folder, "toggle.so")
    Path(src).write_text(_TOGGLE_C)
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", lib, src], check=True)
    return lib


def callgrind_parts(out_file: str) -> list[int]:
    """Instructions of each section dumped (``mw_dump``, then ``mw_stop``), all threads, in order."""
    dumps = sorted(Path(out_file).parent.glob(Path(out_file).name + ".*"), key=lambda p: int(p.suffix[1:]))
    parts = []
    for dump in dumps:
        for line in dump.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                parts.append(int(line.split()[1]))
                break
    if not parts:
        raise RuntimeError(f"{out_file}: no callgrind dump")
    return parts


def callgrind_total(out_file: str) -> int:
    """Instructions between ``mw_start`` and ``mw_stop``, all threads."""
    return sum(callgrind_parts(out_file))


def callgrind_command(out_file: str) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_file}"]


def _callgrind_child(mode: str, allocations: int, lib: str) -> None:
    """One mode's loop between the helper's start and stop (run under callgrind by the parent)."""
    import contextlib
    import ctypes

    from memwarden.record.live.stream import Streamer

    toggle = ctypes.CDLL(lib)
    tmp = tempfile.mkdtemp()
    # No periodic flush (see the docstring): the thread waits out a day-long interval.
    init = Streamer.__init__
    Streamer.__init__ = lambda self, cap, path, interval_s=0.1: init(self, cap, path, 86_400.0)  # type: ignore[method-assign]
    recorder = native.load()
    if mode.endswith("crash ring"):
        ring_dir = tempfile.mkdtemp(dir=_ring_parent(Path(tmp)))
        recorder.ring_attach(os.path.join(ring_dir, "events.ring"), RING_ROWS, RING_SIDE_BYTES)
    ctx = (
        contextlib.nullcontext() if mode == "untraced" else memwarden.capture(stream_to=os.path.join(tmp, "s.mwtrace"))
    )
    with ctx:
        for _ in range(2000):  # warm-up: op names interned, allocator caches filled
            torch.ones(16)
        toggle.mw_start()
        for _ in range(allocations):
            torch.ones(16)
        toggle.mw_stop()


def _callgrind(allocations: int) -> dict[str, object]:
    folder = tempfile.mkdtemp(prefix="mw-callgrind-")
    lib = toggle_library(folder)
    per: dict[str, float] = {}
    for index, mode in enumerate(CALLGRIND_MODES):
        out = os.path.join(folder, f"cg.{index}")
        cmd = [
            *callgrind_command(out),
            sys.executable,
            __file__,
            "--callgrind-child",
            mode,
            "--allocations",
            str(allocations),
            "--lib",
            lib,
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        per[mode] = callgrind_total(out) / allocations
    stream, ring = per["capture(stream_to)"], per["capture(stream_to)+crash ring"]
    return {
        "allocations": allocations,
        "instructions_per_allocation": {k: round(v, 1) for k, v in per.items()},
        "crash_ring_added_instructions": round(ring - stream, 1),
        "crash_ring_added_pct": round(100 * (ring - stream) / stream, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--callgrind", action="store_true", help="instructions per allocation under callgrind")
    parser.add_argument("--allocations", type=int, default=20_000, help="with --callgrind: loop length")
    parser.add_argument("--callgrind-child", choices=CALLGRIND_MODES, help=argparse.SUPPRESS)
    parser.add_argument("--lib", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.callgrind_child:
        _callgrind_child(args.callgrind_child, args.allocations, args.lib)
        return
    if args.callgrind:
        result = _callgrind(args.allocations)
        print(json.dumps(result, indent=2) if args.json else "\n".join(f"{k:32s} {v}" for k, v in result.items()))
        return
    model = torch.nn.Linear(1024, 1024)
    x = torch.randn(4, 1024)
    tmp = tempfile.mkdtemp()
    ring_path = os.path.join(tmp, "ring.mwtrace")
    allocations = 0
    with memwarden.capture(ring_s=args.window, stream_to=ring_path) as cap:
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            with torch.no_grad():
                model(x)
            for _ in range(20):
                torch.ones(16)
            allocations += 22
        stats = memwarden.ring_stats() or {}
        stream_bytes = os.path.getsize(ring_path)
    trace = cap.trace
    n = 20_000
    per_event: dict[str, list[float]] = {
        "untraced": [],
        "capture(stream_to)": [],
        "capture(stream_to)+crash ring": [],
        "capture(ring_s)": [],
    }
    recorder = native.load()
    # where the supervisor puts it (supervisor._ring_parent): shared memory, no disk writes
    ring_file = os.path.join(tempfile.mkdtemp(dir=_ring_parent(Path(tmp))), "events.ring")
    for _ in range(args.repeats):
        per_event["untraced"].append(_tight(n))
        with memwarden.capture(stream_to=os.path.join(tmp, "plain.mwtrace")):
            per_event["capture(stream_to)"].append(_tight(n))
        recorder.ring_attach(ring_file, RING_ROWS, RING_SIDE_BYTES)
        try:
            with memwarden.capture(stream_to=os.path.join(tmp, "crash.mwtrace")):
                per_event["capture(stream_to)+crash ring"].append(_tight(n))
        finally:
            recorder.ring_detach()
        with memwarden.capture(ring_s=args.window, stream_to=os.path.join(tmp, "ring2.mwtrace")):
            per_event["capture(ring_s)"].append(_tight(n))
    result = {
        "seconds": args.seconds,
        "window_s": args.window,
        "allocations": allocations,
        "rows_logged_bytes": allocations * 2 * 64,
        "max_log_bytes": stats.get("max_log_bytes"),
        "cuts": stats.get("cuts"),
        "dropped_rows": stats.get("dropped_rows"),
        "stream_bytes_at_end": stream_bytes,
        "trace_events": trace.num_events,
        "per_allocation_us": {k: round(statistics.median(v) * 1e6, 3) for k, v in per_event.items()},
    }
    stream = statistics.median(per_event["capture(stream_to)"])
    crash = statistics.median(per_event["capture(stream_to)+crash ring"])
    result["crash_ring_added_pct"] = round(100 * (crash - stream) / stream, 2)
    stream, crash = min(per_event["capture(stream_to)"]), min(per_event["capture(stream_to)+crash ring"])
    result["crash_ring_added_pct_of_minima"] = round(100 * (crash - stream) / stream, 2)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        print(f"{key:22s} {value}")


if __name__ == "__main__":
    main()
