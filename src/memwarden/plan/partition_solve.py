"""``solve``: the partitioner's entry point, choosing the solver for the graph (see
``memwarden.plan.partition`` for the model and when the answer is exact)."""

from __future__ import annotations

import numpy as np

from memwarden.plan.partition import MILP_MAX_NODES, PartitionProblem, Solution, chain_dp, evaluate, is_chain
from memwarden.plan.partition_baselines import affinity_greedy, all_cpu
from memwarden.plan.partition_milp import solve_milp
from memwarden.plan.partition_search import local_search

__all__ = ["solve"]


def solve(problem: PartitionProblem, *, time_limit_s: float = 30.0, max_exact_nodes: int = MILP_MAX_NODES) -> Solution:
    """The lowest-latency assignment that fits every unit (see the module docstring for when it is exact)."""
    if is_chain(problem):
        assign = chain_dp(problem)
        ev = evaluate(problem, assign)
        if ev.feasible:
            return Solution("chain-dp", assign, ev, exact=True)
    if problem.num_nodes <= max_exact_nodes:
        assign, optimal = solve_milp(problem, time_limit_s=time_limit_s)
        milp = Solution("milp", assign, evaluate(problem, assign), exact=optimal)
        if optimal:
            return milp
    starts = [s for s in (all_cpu(problem), affinity_greedy(problem, max_moves=64)) if s.evaluation.feasible]
    start = (
        min(starts, key=lambda s: s.evaluation.latency_us).assign
        if starts
        else np.full(problem.num_nodes, problem.host)
    )
    found = local_search(problem, start, budget_s=min(0.5, time_limit_s))
    if problem.num_nodes <= max_exact_nodes and (milp.evaluation.feasible, -milp.evaluation.latency_us) >= (
        found.evaluation.feasible,
        -found.evaluation.latency_us,
    ):
        return milp
    return found
