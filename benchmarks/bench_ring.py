"""The flight recorder's own memory and per-event cost (``capture(ring_s=...)``).

A serving loop (a Linear layer's forward plus small temporaries per request) runs for
``--seconds`` under ``memwarden.capture(ring_s=--window, stream_to=tmp)``; reported: the most the
recorder's log held (``max_log_bytes``), the stream file's size at the end, events dropped, and
the time per allocation of a tight ``torch.ones(16)`` loop untraced, under a plain streamed
capture and under the ring (interleaved, medians).

    python benchmarks/bench_ring.py [--seconds 60] [--window 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

import memwarden


def _tight(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        torch.ones(16)
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--window", type=float, default=5.0)
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
    per_event: dict[str, list[float]] = {"untraced": [], "capture(stream_to)": [], "capture(ring_s)": []}
    for _ in range(5):
        per_event["untraced"].append(_tight(n))
        with memwarden.capture(stream_to=os.path.join(tmp, "plain.mwtrace")):
            per_event["capture(stream_to)"].append(_tight(n))
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
        "per_allocation_us": {k: round(statistics.median(v) * 1e6, 2) for k, v in per_event.items()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        print(f"{key:22s} {value}")


if __name__ == "__main__":
    main()
