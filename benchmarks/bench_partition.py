"""Partition speed on large graphs, and the solver against the baselines on them.

    .venv/bin/python benchmarks/bench_partition.py [NODES] [UNITS]

A random layered DAG (each node reads 1-2 earlier nodes, as a transformer's residual stream
does) with memory limits that bind on the accelerators; graphs above ``MILP_MAX_NODES`` use the
coarse program (see ``memwarden.plan.partition``).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from memwarden.plan.partition import PartitionProblem
from memwarden.plan.partition_baselines import baselines
from memwarden.plan.partition_solve import solve


def layered(n: int, nu: int, seed: int = 0) -> PartitionProblem:
    rng = np.random.default_rng(seed)
    compute = rng.uniform(1, 100, size=(n, nu)) * np.r_[1.0, rng.uniform(0.05, 0.5, nu - 1)]
    compute[:, 1:][rng.random((n, nu - 1)) < 0.2] = np.inf
    edges = sorted({(b - 1, b) for b in range(1, n)} | {(int(rng.integers(max(0, b - 8), b)), b) for b in range(1, n)})
    e = np.array(edges, dtype=np.int64)
    out = rng.integers(1, 500, n).astype(float)
    weights = rng.integers(0, 1000, n).astype(float)
    cap = np.r_[1e12, np.full(nu - 1, 0.4 * (weights.sum() + out.sum()))]
    lat = np.full((nu, nu), 10.0) - 10.0 * np.eye(nu)
    per_byte = np.full((nu, nu), 0.01) - 0.01 * np.eye(nu)
    inputs, results = np.zeros(n), np.zeros(n)
    inputs[0], results[-1] = 100, 50
    return PartitionProblem(
        names=tuple(map(str, range(n))), op_types=("Op",) * n, unit_names=tuple(f"u{u}" for u in range(nu)),
        compute_us=compute, weight_bytes=weights, output_bytes=out, edges=e, edge_bytes=out[e[:, 0]],
        input_bytes=inputs, result_bytes=results, capacity_bytes=cap, transfer_latency_us=lat,
        transfer_us_per_byte=per_byte, host=0, priority=tuple(range(nu - 1, -1, -1)),
    )  # fmt: skip


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    nu = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    problem = layered(n, nu)
    start = time.perf_counter()
    solution = solve(problem)
    elapsed = time.perf_counter() - start
    print(f"{n} nodes x {nu} units: {solution.method} in {elapsed:.3f} s, latency {solution.evaluation.latency_us / 1e3:.2f} ms, "
          f"feasible {solution.evaluation.feasible}, exact {solution.exact}")  # fmt: skip
    for b in baselines(problem):
        print(f"  {b.method:16s} {b.evaluation.latency_us / 1e3:9.2f} ms  feasible {b.evaluation.feasible}")


if __name__ == "__main__":
    main()
