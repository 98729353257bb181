"""The flight recorder's own memory and per-event cost (``capture(ring_s=...)``).

A serving loop (a Linear layer's forward plus small temporaries per request) runs for
``--seconds`` under ``memwarden.capture(ring_s=--window, stream_to=tmp)``; reported: the most the
recorder's log held (``max_log_bytes``), the stream file's size at the end, events dropped, and
the thread CPU time per allocation of a tight ``torch.ones(16)`` loop untraced, under a plain streamed
capture, under a streamed capture with the crash ring attached (what ``memwarden trace``'s child
runs: every row also copied into a mapped file, native ``ring_attach``) and under the flight
recorder (interleaved, medians), and the crash ring's cost over the plain stream in percent.

    python benchmarks/bench_ring.py [--seconds 60] [--window 5] [--repeats 9] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
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
    per_event: dict[str, list[float]] = {"untraced": [], "capture(stream_to)": [],
                                         "capture(stream_to)+crash ring": [], "capture(ring_s)": []}  # fmt: skip
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
