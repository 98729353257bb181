"""The fallback for graphs too large for the exact program: steepest single-node moves from the
best feasible greedy start, within a time budget.

Each pass walks the nodes in topological order and moves a node to the unit that lowers the
latency most (its compute difference plus the transfers it causes, computed locally with the
evaluation's rule: a tensor is moved once to each unit where a reader of it runs),
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
    group, producer, group_bytes = problem.edge_groups()
    reads: list[set[int]] = [set() for _ in range(n)]  # tensors each node reads
    writes: list[list[int]] = [[] for _ in range(n)]  # tensors each node produces
    readers = np.zeros((len(group_bytes), nu), dtype=np.int64)  # per tensor: its readers on each unit
    for g, b in zip(group.tolist(), problem.edges[:, 1].tolist(), strict=True):
        if g not in reads[b]:
            reads[b].add(g)
            readers[g, assign[b]] += 1
    for g, a in enumerate(producer.tolist()):
        writes[a].append(g)
    host = problem.host
    passes = 0
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        passes += 1
        for v in range(n):
            cost = problem.compute_us[v].copy()  # (U,) latency terms that depend on v's unit
            current = assign[v]
            for g in reads[v]:  # moved to v's unit unless another reader there already has it
                w = assign[producer[g]]
                alone = (readers[g] - (units == current)) == 0
                cost += problem.transfer_cost(w, units, group_bytes[g]) * ((units != w) & alone)
            for g in writes[v]:  # moved from v's unit to every other unit its readers are on
                for w in np.flatnonzero(readers[g]).tolist():
                    cost += problem.transfer_cost(units, w, group_bytes[g]) * (units != w)
            if problem.input_bytes[v]:
                cost += problem.transfer_cost(host, units, problem.input_bytes[v]) * (units != host)
            if problem.result_bytes[v]:
                cost += problem.transfer_cost(units, host, problem.result_bytes[v]) * (units != host)
            for target in np.argsort(cost).tolist():
                if cost[target] >= cost[current] - 1e-9:
                    break
                assign[v] = target
                if np.all(memory_peaks(problem, assign) <= problem.capacity_bytes):
                    improved = True
                    for g in reads[v]:
                        readers[g, current] -= 1
                        readers[g, target] += 1
                    break
                assign[v] = current
            if time.perf_counter() >= deadline:
                break
    return Solution("local-search", assign, evaluate(problem, assign), exact=False, detail={"passes": passes})
