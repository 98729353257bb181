"""Partition speed on large graphs, and the solver against the baselines on them.

    .venv/bin/python benchmarks/bench_partition.py [NODES] [UNITS]
    .venv/bin/python benchmarks/bench_partition.py --zoo [--size small] [--dtype fp16] [--time-limit S] [--only GRAPH:DEVICE]

A random layered DAG (each node reads 1-2 earlier nodes, as a transformer's residual stream
does) with memory limits that bind on the accelerators; graphs above ``MILP_MAX_NODES`` use the
local search (see ``memwarden.plan.partition``). ``--zoo`` exports the zoo's LLaVA and Qwen2-VL
parts and partitions each on every built-in profile with compute units, as ``memwarden
partition`` does (``partition_result``), checking 0 violations and latency <= every baseline.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

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
        names=tuple(map(str, range(n))),
        op_types=("Op",) * n,
        unit_names=tuple(f"u{u}" for u in range(nu)),
        compute_us=compute,
        weight_bytes=weights,
        output_bytes=out,
        edges=e,
        edge_bytes=out[e[:, 0]],
        input_bytes=inputs,
        result_bytes=results,
        capacity_bytes=cap,
        transfer_latency_us=lat,
        transfer_us_per_byte=per_byte,
        host=0,
        priority=tuple(range(nu - 1, -1, -1)),
    )


ZOO_DEVICES = ("galaxy-s24-ultra-12gb", "jetson-orin-nx-16gb", "iphone-15-pro")


def zoo(size: str, dtype: str, time_limit_s: float, only: str | None) -> None:
    from memwarden.models.compute_units import load_compute_units
    from memwarden.plan.partition_onnx import load_problem
    from memwarden.plan.partition_report import partition_result
    from memwarden.record.onnx.export import export_zoo

    out = Path(tempfile.mkdtemp(prefix="bench-partition-"))
    names = ["all-cpu", "first-claim", "capacity-halt", "affinity-greedy", "single-split"]
    print("| graph | device | nodes | memwarden | exact | " + " | ".join(names) + " | solve + baselines |")
    print("|---|---|---:|---|---|" + "---:|" * len(names) + "---:|")
    bad = 0
    for model in ("llava", "qwen2-vl"):
        for part, path in export_zoo(model, out, size=size).items():
            for device in ZOO_DEVICES:
                if only and only != f"{model}-{part}:{device}":
                    continue
                problem = load_problem(path, load_compute_units(device), dtype=dtype)
                start = time.perf_counter()
                result = partition_result(problem, time_limit_s=time_limit_s)
                elapsed = time.perf_counter() - start
                sol = result["solution"]
                lat = sol["latency_us"]
                units = ", ".join(f"{u} {k}" for u, k in sol["nodes_per_unit"].items() if k)
                cells = []
                for b in result["baselines"]:
                    cells.append(f"{b['latency_us'] / 1e3:.3f}" + ("" if b["feasible"] else " ✗"))
                    bad += b["feasible"] and b["latency_us"] < lat - 1e-6
                bad += bool(sol["violations"])
                print(
                    f"| {model}-{part} | {device} | {result['nodes']} | {lat / 1e3:.3f} ms ({sol['method']}, {units}) "
                    f"| {'yes' if sol['exact'] else 'no'} | " + " | ".join(cells) + f" | {elapsed:.2f} s |",
                    flush=True,
                )
    print(f"\nrows over a limit or slower than a feasible baseline: {bad}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("nodes", nargs="?", type=int, default=2000)
    ap.add_argument("units", nargs="?", type=int, default=4)
    ap.add_argument("--zoo", action="store_true", help="the exported zoo graphs on the built-in profiles")
    ap.add_argument("--size", default="small")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--time-limit", type=float, default=30.0, help="solver time limit (s), as the CLI's")
    ap.add_argument("--only", help="one row: GRAPH:DEVICE, e.g. llava-prefill:galaxy-s24-ultra-12gb")
    args = ap.parse_args()
    if args.zoo:
        zoo(args.size, args.dtype, args.time_limit, args.only)
        return
    n, nu = args.nodes, args.units
    problem = layered(n, nu)
    start = time.perf_counter()
    solution = solve(problem)
    elapsed = time.perf_counter() - start
    print(
        f"{n} nodes x {nu} units: {solution.method} in {elapsed:.3f} s, latency {solution.evaluation.latency_us / 1e3:.2f} ms, "
        f"feasible {solution.evaluation.feasible}, exact {solution.exact}"
    )
    for b in baselines(problem):
        print(f"  {b.method:16s} {b.evaluation.latency_us / 1e3:9.2f} ms  feasible {b.evaluation.feasible}")


if __name__ == "__main__":
    main()
