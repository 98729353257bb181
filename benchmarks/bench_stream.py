"""Streaming overhead: the same loop of small model steps under ``memwarden.capture()`` in memory
and with ``stream_to=`` (a flush at every step and every 100 ms), best of 3 each.

    .venv/bin/python benchmarks/bench_stream.py [STEPS]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import torch

import memwarden


def workload(model: torch.nn.Module, steps: int) -> None:
    x = torch.randn(8, 256)
    with torch.no_grad():
        for _ in range(steps):
            model(x)


def timed(steps: int, stream: str | None) -> tuple[float, int]:
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    t = time.perf_counter()
    with memwarden.capture(stream_to=stream) as cap:
        workload(model, steps)
    elapsed = time.perf_counter() - t
    return elapsed, cap.trace.num_events if cap.trace else 0


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s.mwtrace")
        t0 = time.perf_counter()
        workload(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]), steps)
        bare = time.perf_counter() - t0
        mem = min(timed(steps, None)[0] for _ in range(3))
        streamed = min(timed(steps, path)[0] for _ in range(3))
        events = timed(steps, None)[1]
    print(f"steps {steps}, events {events}: no capture {bare:.3f} s, in-memory capture {mem:.3f} s, "
          f"streamed {streamed:.3f} s: streaming adds {100 * (streamed / mem - 1):+.1f}% over in-memory")  # fmt: skip


if __name__ == "__main__":
    main()
