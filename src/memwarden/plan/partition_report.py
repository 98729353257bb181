"""The result of ``memwarden partition`` as plain data: the solver's answer beside every baseline."""

from __future__ import annotations

from collections import Counter
from typing import Any

from memwarden.plan.partition import PartitionProblem, Solution
from memwarden.plan.partition_baselines import baselines
from memwarden.plan.partition_solve import solve

__all__ = ["partition_result", "solution_json"]


def solution_json(problem: PartitionProblem, solution: Solution, *, with_nodes: bool = False) -> dict[str, Any]:
    ev = solution.evaluation
    counts = Counter(problem.unit_names[int(u)] for u in solution.assign)
    out: dict[str, Any] = {
        "method": solution.method,
        "exact": solution.exact,
        "feasible": ev.feasible,
        "latency_us": ev.latency_us,
        "compute_us": ev.compute_us,
        "transfer_us": ev.transfer_us,
        "memory_bytes": dict(zip(problem.unit_names, ev.memory_bytes, strict=True)),
        "nodes_per_unit": {u: counts.get(u, 0) for u in problem.unit_names},
        "violations": list(ev.violations),
        **solution.detail,
    }
    if with_nodes:
        modules = problem.modules or ("",) * problem.num_nodes
        out["nodes"] = [
            {"name": name, "op_type": op, "module": module, "unit": problem.unit_names[int(u)]}
            for name, op, module, u in zip(problem.names, problem.op_types, modules, solution.assign, strict=True)
        ]
    return out


def partition_result(problem: PartitionProblem, *, time_limit_s: float = 30.0) -> dict[str, Any]:
    """Solve, score the baselines, and keep the solver's answer no worse than any feasible baseline
    (only the coarse fallback can lose to one; the exact solvers never do)."""
    best = solve(problem, time_limit_s=time_limit_s)
    others = baselines(problem)
    feasible = [b for b in others if b.evaluation.feasible]
    if feasible:
        champion = min(feasible, key=lambda b: b.evaluation.latency_us)
        if not best.evaluation.feasible or champion.evaluation.latency_us < best.evaluation.latency_us:
            best = Solution(f"{best.method}+{champion.method}", champion.assign, champion.evaluation, exact=False)
    return {
        "nodes": problem.num_nodes,
        "edges": int(len(problem.edges)),
        "units": list(problem.unit_names),
        "capacity_bytes": dict(zip(problem.unit_names, (int(c) for c in problem.capacity_bytes), strict=True)),
        "solution": solution_json(problem, best, with_nodes=True),
        "baselines": [solution_json(problem, b) for b in others],
    }
