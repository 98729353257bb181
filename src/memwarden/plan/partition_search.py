"""The fallback for graphs too large for the exact program: steepest single-node moves from the
best feasible greedy start, within a time budget.

Each pass walks the nodes in topological order and moves a node to the unit that lowers the
latency most (its compute difference plus the transfers on its own edges, computed locally),
keeping a move only if every unit still fits (the memory check is the full sweep, run only for
moves that gain). The result is feasible whenever the start is (all-on-host always fits when the
host can hold the model) and never slower than it; it is not proven optimal.
"""

from __future__ import annotations

import time

import numpy as np

from memwarden.plan.partition import PartitionProblem, Solution, evaluate, memory_peaks

__all__ = ["local_search"]


def local_search(problem: PartitionProblem, start: np.ndarray, *, budget_s: float = 0.7) -> Solution:
    deadline = time.perf_counter() + budget_s
    n, nu = problem.num_nodes, problem.num_units
    assign = np.asarray(start, dtype=np.int64).copy()
    units = np.arange(nu)
    incident: list[list[tuple[int, float, bool]]] = [[] for _ in range(n)]  # (other node, bytes, other is producer)
    for (a, b), nbytes in zip(problem.edges.tolist(), problem.edge_bytes.tolist(), strict=True):
        incident[b].append((a, nbytes, True))
        incident[a].append((b, nbytes, False))
    host = problem.host
    passes = 0
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        passes += 1
        for v in range(n):
            cost = problem.compute_us[v].copy()  # (U,) latency terms that depend on v's unit
            for other, nbytes, producer in incident[v]:
                w = assign[other]
                if producer:
                    cost += problem.transfer_cost(w, units, nbytes) * (units != w)
                else:
                    cost += problem.transfer_cost(units, w, nbytes) * (units != w)
            if problem.input_bytes[v]:
                cost += problem.transfer_cost(host, units, problem.input_bytes[v]) * (units != host)
            if problem.result_bytes[v]:
                cost += problem.transfer_cost(units, host, problem.result_bytes[v]) * (units != host)
            current = assign[v]
            for target in np.argsort(cost).tolist():
                if cost[target] >= cost[current] - 1e-9:
                    break
                assign[v] = target
                if np.all(memory_peaks(problem, assign) <= problem.capacity_bytes):
                    improved = True
                    break
                assign[v] = current
            if time.perf_counter() >= deadline:
                break
    return Solution("local-search", assign, evaluate(problem, assign), exact=False, detail={"passes": passes})
