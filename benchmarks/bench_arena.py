"""Static arena planning time for 100k tensors.

Two synthetic traces of about 100k tensors: training-like (activations saved
until backward, from ``bench_allocator``) and inference-like (preexisting
weights, short-lived activations, a KV cache that grows by concatenation each
decode step). Run ``python benchmarks/bench_arena.py [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_allocator import synthetic_trace  # noqa: E402

from memwarden.plan.arena.plan import lifetimes, plan_arena  # noqa: E402
from memwarden.trace.model import EVENT_COLUMNS, Action, Trace  # noqa: E402


def inference_trace(num_tensors: int = 100_000, seed: int = 0, layers: int = 32, hidden: int = 2048) -> Trace:
    """Prefill then decode: per layer a few short-lived activations and K/V re-grown by one token per step."""
    rng = np.random.default_rng(seed)
    action: list[int] = []
    tensor: list[int] = []
    nbytes: list[int] = []
    sizes: dict[int, int] = {}
    next_id = 0

    def new(n: int, kind: Action = Action.ALLOC) -> int:
        nonlocal next_id
        next_id += 1
        action.append(kind)
        tensor.append(next_id)
        nbytes.append(n)
        sizes[next_id] = n
        return next_id

    def free(t: int) -> None:
        action.append(Action.FREE)
        tensor.append(t)
        nbytes.append(sizes.pop(t))

    for _ in range(layers * 7):
        new(hidden * hidden * 2 * int(rng.choice([1, 1, 3])), Action.PREEXISTING)
    tokens = int(rng.integers(600, 1200))  # prompt incl. image tokens
    kv = [new(tokens * hidden * 2) for _ in range(2 * layers)]
    step_tokens = tokens
    while next_id < num_tensors:
        width = step_tokens if step_tokens == tokens else 1
        hidden_state = new(width * hidden * 2)
        for layer in range(layers):
            tmp = [new(width * hidden * 2 * m) for m in (1, 3, 4, 1)]
            for k in (2 * layer, 2 * layer + 1):  # torch.cat(past, new): n+1 tokens, old one freed
                grown = new((step_tokens + 1) * hidden * 2)
                free(kv[k])
                kv[k] = grown
            for t in tmp:
                free(t)
        free(hidden_state)
        step_tokens += 1
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
    parser.add_argument("--tensors", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    traces = {
        "training": synthetic_trace(2 * args.tensors),  # about one tensor per two events
        "inference": inference_trace(args.tensors),
    }
    results: dict[str, dict[str, object]] = {}
    for trace_name, trace in traces.items():
        life = lifetimes(trace)
        for strategy in ("greedy-by-size", "greedy-by-breadth", "best"):
            wall = cpu = float("inf")
            for _ in range(args.repeat):
                start, start_cpu = time.perf_counter(), time.process_time()
                plan = plan_arena(life, strategy)
                wall = min(wall, time.perf_counter() - start)
                cpu = min(cpu, time.process_time() - start_cpu)
            key = f"{trace_name}/{strategy}"
            results[key] = {
                "tensors": len(life),
                "seconds": round(wall, 3),
                "cpu_seconds": round(cpu, 3),
                "arena_bytes": plan.arena_bytes,
                "lower_bound_bytes": plan.lower_bound_bytes,
                "naive_bytes": plan.naive_bytes,
                "chosen": plan.strategy,
            }
            if not args.json:
                print(
                    f"bench_arena {key}: {len(life)} tensors in {wall:.3f} s wall ({cpu:.3f} s CPU), "
                    f"arena {plan.arena_bytes / 2**20:.1f} MiB (lower bound {plan.lower_bound_bytes / 2**20:.1f}, "
                    f"naive {plan.naive_bytes / 2**20:.0f} MiB, {plan.strategy})"
                )
    if args.json:
        json.dump({"benchmark": "arena_plan", "results": results}, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
