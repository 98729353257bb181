"""The partitions people use today, scored by the same model as the solver
(``memwarden.plan.partition.evaluate``):

- ``all-cpu``: everything on the host unit (the fallback every node can use);
- ``first-claim``: ONNX Runtime's rule: units in priority order, each node goes to the first
  that supports its op type and dtype; no memory check;
- ``capacity-halt``: ORT's capacity-aware mode: as first-claim, walking the topological order,
  but once a node would push a unit past its limit, that node and every later one that unit
  would have claimed go to the next unit ("halts at the first node that would exceed the
  budget; ONNX Runtime does not search ahead");
- ``affinity-greedy``: the usual hand-written pass: each node to the unit where it finishes
  soonest (its compute plus moving its inputs there, unless an earlier reader already moved
  them), then, while a unit is over its limit,
  backtrack by moving that unit's heaviest node to its next-best unit;
- ``single-split``: Neurosurgeon: a prefix of the topological order on one unit and the rest on
  another (nodes a unit cannot run stay on the host), best over every split and unit pair.
"""

from __future__ import annotations

import numpy as np

from memwarden.plan.partition import PartitionProblem, Solution, evaluate

__all__ = ["BASELINES", "affinity_greedy", "all_cpu", "baselines", "capacity_halt", "first_claim", "single_split"]


def _solution(method: str, problem: PartitionProblem, assign: np.ndarray) -> Solution:
    return Solution(method, assign, evaluate(problem, assign), exact=False)


def _claim_order(problem: PartitionProblem) -> list[int]:
    priority = problem.priority or tuple(range(problem.num_units))
    return sorted(range(problem.num_units), key=lambda u: (priority[u], u))


def all_cpu(problem: PartitionProblem) -> Solution:
    return _solution("all-cpu", problem, np.full(problem.num_nodes, problem.host, dtype=np.int64))


def first_claim(problem: PartitionProblem) -> Solution:
    supported = problem.supported()
    assign = np.full(problem.num_nodes, problem.host, dtype=np.int64)
    for u in reversed(_claim_order(problem)):  # the highest priority writes last, so it wins
        assign[supported[:, u]] = u
    return _solution("first-claim", problem, assign)


def capacity_halt(problem: PartitionProblem) -> Solution:
    supported = problem.supported()
    order = _claim_order(problem)
    halted: set[int] = set()
    used = np.zeros(problem.num_units)
    assign = np.full(problem.num_nodes, problem.host, dtype=np.int64)
    for v in range(problem.num_nodes):
        for u in order:
            if u in halted or not supported[v, u]:
                continue
            need = problem.weight_bytes[v] + problem.output_bytes[v]
            if u != problem.host and used[u] + need > problem.capacity_bytes[u]:
                halted.add(u)  # no look-ahead: this unit takes nothing more
                continue
            used[u] += problem.weight_bytes[v]
            assign[v] = u
            break
    return _solution("capacity-halt", problem, assign)


def affinity_greedy(problem: PartitionProblem, max_moves: int | None = None) -> Solution:
    n, nu = problem.num_nodes, problem.num_units
    units = np.arange(nu)
    group, _, _ = problem.edge_groups()
    preds: list[list[tuple[int, int, float]]] = [[] for _ in range(n)]  # (producer, tensor, bytes)
    for (a, b), g, nbytes in zip(problem.edges.tolist(), group.tolist(), problem.edge_bytes.tolist(), strict=True):
        preds[b].append((a, g, nbytes))
    assign = np.full(n, problem.host, dtype=np.int64)
    finish = np.zeros((n, nu))
    moved: set[tuple[int, int]] = set()  # (tensor, unit) already copied there
    for v in range(n):
        cost = problem.compute_us[v].copy()
        for a, g, nbytes in preds[v]:
            there = np.array([(g, u) in moved for u in range(nu)])
            cost = cost + problem.transfer_cost(assign[a], units, nbytes) * ((units != assign[a]) & ~there)
        finish[v] = cost
        assign[v] = int(np.argmin(cost))
        moved.update((g, int(assign[v])) for _, g, _ in preds[v])
    # backtrack: move the heaviest node off an overfull unit to its next-best unit
    budget = max_moves if max_moves is not None else 4 * n
    for _ in range(budget):
        ev = evaluate(problem, assign)
        over = [u for u in range(nu) if ev.memory_bytes[u] > problem.capacity_bytes[u]]
        if not over:
            break
        u = over[0]
        members = np.flatnonzero(assign == u)
        if not len(members):
            break
        v = int(members[np.argmax(problem.weight_bytes[members] + problem.output_bytes[members])])
        options = [w for w in np.argsort(finish[v]).tolist() if w != u and np.isfinite(problem.compute_us[v, w])]
        assign[v] = options[0] if options else problem.host
        finish[v, u] = np.inf
    return _solution("affinity-greedy", problem, assign)


def single_split(problem: PartitionProblem) -> Solution:
    n, nu = problem.num_nodes, problem.num_units
    supported = problem.supported()
    best: Solution | None = None
    # every cut on graphs up to 256 nodes; 129 evenly spaced cuts above (the scan is O(cuts U^2 N))
    cuts = range(n + 1) if n <= 256 else sorted(set(np.linspace(0, n, 129).astype(int).tolist()))
    for first in range(nu):
        for second in range(nu):
            for cut in cuts:
                assign = np.where(np.arange(n) < cut, first, second)
                assign = np.where(supported[np.arange(n), assign], assign, problem.host)
                if first == second and cut not in (0, n):
                    continue
                ev = evaluate(problem, assign)
                if best is None or (ev.feasible, -ev.latency_us) > (
                    best.evaluation.feasible,
                    -best.evaluation.latency_us,
                ):
                    best = Solution(
                        "single-split", assign, ev, exact=False, detail={"cut": cut, "units": [first, second]}
                    )
    assert best is not None
    return best


BASELINES = {
    "all-cpu": all_cpu,
    "first-claim": first_claim,
    "capacity-halt": capacity_halt,
    "affinity-greedy": affinity_greedy,
    "single-split": single_split,
}


def baselines(problem: PartitionProblem) -> list[Solution]:
    return [fn(problem) for fn in BASELINES.values()]
