"""Replay speed of the caching-allocator model: events per second on a synthetic 1M-event trace.

The trace imitates transformer training with a varying sequence length per
step (the case that fragments a caching allocator): preexisting weights,
per-layer activations saved until backward, short-lived temporaries from a few
hundred bytes to tens of MiB. Run ``python benchmarks/bench_allocator.py [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from memwarden.plan.allocator.config import AllocatorConfig
from memwarden.plan.replay import replay
from memwarden.trace.model import EVENT_COLUMNS, Action, Trace


def synthetic_trace(num_events: int = 1_000_000, seed: int = 0, hidden: int = 1024, layers: int = 24) -> Trace:
    """A training-like allocation trace with about ``num_events`` rows on device 0."""
    rng = np.random.default_rng(seed)
    action: list[int] = []
    tensor: list[int] = []
    nbytes: list[int] = []
    next_id = 0

    def alloc(n: int, kind: Action = Action.ALLOC) -> int:
        nonlocal next_id
        next_id += 1
        action.append(kind)
        tensor.append(next_id)
        nbytes.append(n)
        return next_id

    sizes: dict[int, int] = {}

    def free(t: int) -> None:
        action.append(Action.FREE)
        tensor.append(t)
        nbytes.append(sizes.pop(t))

    def new(n: int, kind: Action = Action.ALLOC) -> int:
        t = alloc(n, kind)
        sizes[t] = n
        return t

    for _ in range(layers * 4):  # weights: 4 matrices per layer, bf16
        new(hidden * hidden * 2 * int(rng.choice([1, 1, 4])), Action.PREEXISTING)
    while len(action) < num_events:
        seq = int(rng.integers(300, 513))  # varying sequence length per step
        saved: list[int] = []
        for _layer in range(layers):
            for width in (hidden, 3 * hidden, hidden, 4 * hidden):  # (seq, width) bf16 activations
                saved.append(new(seq * width * 2))
            saved.append(new(16 * seq * seq * 2))  # (heads, seq, seq) attention probabilities
            for _ in range(4):  # temporaries: scalars, norms, small buffers
                t = new(int(rng.choice([4, 64, 2048, seq * 4, seq * hidden * 4])))
                free(t)
        for t in reversed(saved):  # backward: grads of activations, then free what was saved
            g = new(sizes[t])
            free(t)
            free(g)
    n = len(action)
    events = {name: np.zeros(n, dtype=dt) for name, dt in EVENT_COLUMNS.items()}
    events["time_us"] = np.arange(n, dtype=np.int64)
    events["action"] = np.asarray(action, dtype=np.uint8)
    events["tensor"] = np.asarray(tensor, dtype=np.int64)
    events["nbytes"] = np.asarray(nbytes, dtype=np.int64)
    events["module"][:] = events["op"][:] = events["dtype"][:] = events["shape"][:] = -1
    return Trace(events=events, spans={}, devices=["cuda:0"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    trace = synthetic_trace(args.events)
    results = {}
    for name, config in [
        ("pytorch", AllocatorConfig()),
        ("pytorch-expandable", AllocatorConfig(expandable_segments=True)),
    ]:
        wall = cpu = float("inf")
        for _ in range(args.repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            result = replay(trace, config)
            wall = min(wall, time.perf_counter() - start)
            cpu = min(cpu, time.process_time() - start_cpu)
        # CPU time is the steadier figure on a shared machine; wall time is what a user waits.
        results[name] = {
            "events": trace.num_events,
            "seconds": round(wall, 3),
            "cpu_seconds": round(cpu, 3),
            "events_per_s": round(trace.num_events / wall),
            "events_per_cpu_s": round(trace.num_events / cpu),
            "peak_allocated_bytes": result.peak_allocated_bytes,
            "peak_reserved_bytes": result.peak_reserved_bytes,
        }
        if not args.json:
            print(
                f"bench_allocator {name}: {trace.num_events} events in {wall:.3f} s wall ({cpu:.3f} s CPU) = "
                f"{trace.num_events / wall:,.0f} events/s ({trace.num_events / cpu:,.0f} per CPU s); "
                f"peak reserved {result.peak_reserved_bytes / 2**20:.0f} MiB, "
                f"allocated {result.peak_allocated_bytes / 2**20:.0f} MiB"
            )
    if args.json:
        json.dump({"benchmark": "allocator_replay", "results": results}, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
