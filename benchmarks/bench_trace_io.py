"""Save / load time of a 1M-event trace (.mwtrace).

python benchmarks/bench_trace_io.py [--events 1000000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from memwarden.trace.io import load, save
from memwarden.trace.model import EVENT_COLUMNS, Action, Trace


def synthetic_trace(n: int, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    half = n // 2
    tensor = np.concatenate([np.arange(half), rng.permutation(half)])
    events = {
        "time_us": np.arange(n, dtype=np.int64) * 3,
        "action": np.concatenate([np.full(half, Action.ALLOC), np.full(n - half, Action.FREE)]).astype(np.uint8),
        "tensor": tensor.astype(np.int64),
        "address": (tensor * 4096).astype(np.uint64),
        "nbytes": rng.integers(512, 1 << 24, n),
        "device": np.zeros(n, np.int16),
        "category": rng.integers(0, 9, n).astype(np.uint8),
        "modality": rng.integers(0, 5, n).astype(np.uint8),
        "phase": rng.integers(0, 7, n).astype(np.uint8),
        "module": rng.integers(-1, 500, n).astype(np.int32),
        "op": rng.integers(-1, 100, n).astype(np.int32),
        "dtype": rng.integers(-1, 3, n).astype(np.int32),
        "shape": rng.integers(-1, 1000, n).astype(np.int32),
        "written_bytes": rng.integers(-1, 1 << 24, n),
    }
    assert set(events) == set(EVENT_COLUMNS)
    strings = [f"model.language_model.layers.{i}.mlp" for i in range(500)] + ["float32", "bfloat16", "int8"]
    shapes = [(1, i, 64) for i in range(1000)]
    return Trace(events=events, spans={}, strings=strings, shapes=shapes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    trace = synthetic_trace(args.events)
    saves, loads = [], []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "big.mwtrace")
        for _ in range(args.repeats):
            t = time.perf_counter()
            save(trace, path)
            saves.append(time.perf_counter() - t)
            t = time.perf_counter()
            back = load(path)
            loads.append(time.perf_counter() - t)
            assert back.num_events == args.events
        size = os.path.getsize(path)
    result = {"events": args.events, "file_bytes": size, "save_s": min(saves), "load_s": min(loads)}
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{args.events:,} events, {size / 2**20:.1f} MiB: save {min(saves):.3f} s, load {min(loads):.3f} s (best of {args.repeats})"
        )


if __name__ == "__main__":
    main()
