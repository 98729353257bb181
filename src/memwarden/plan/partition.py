"""Partition a graph across a device's compute units: minimise simulated latency under each
unit's memory limit.

The model (``PartitionProblem``), shared by the solvers, the baselines and the brute force:

- nodes run one at a time in topological order (one inference stream, as ORT's sequential
  executor and a single-request deployment run them); node ``v`` on unit ``u`` costs
  ``compute_us[v, u]`` (``inf`` where the unit lacks the op type or dtype);
- a tensor read on a unit other than its producer's is moved there once: the slower side's
  latency plus bytes over the slower bandwidth (``memwarden.models.compute_units.transfer_us``),
  however many of its readers sit on that unit (two readers on one unit share one copy; readers
  on two units pay two); graph inputs start on the host unit and graph outputs end there;
- memory: a unit holds the weights of its nodes for the whole run, plus every node output that
  is live (from its producer to its last consumer, in the topological order) and either produced
  on the unit or read by a node on it. This is the sum of live bytes at each step: the lower
  bound an arena planner reaches (``memwarden.plan.arena``), without fragmentation.

Solvers (``memwarden.plan.partition_solve.solve``): a chain is solved exactly by dynamic programming (when the DP's optimum
fits memory it is the constrained optimum too); any other graph up to ``MILP_MAX_NODES`` nodes
exactly by a mixed-integer program (scipy's HiGHS, ``mip_rel_gap`` 0); a program that hits its
time limit is compared with the local search and the better point returned, ``exact: False``.
Larger graphs fall back to a local search
(``memwarden.plan.partition_search``) from the better of all-on-host and an affinity-greedy
start, within a time budget; the result says ``exact: False``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "MILP_MAX_NODES",
    "Evaluation",
    "PartitionProblem",
    "Solution",
    "chain_dp",
    "edge_transfer_us",
    "evaluate",
    "is_chain",
    "memory_peaks",
]

# Up to this many nodes the exact program runs (within the time limit); above it only the local search,
# so a 2,000-node graph is answered in under a second. The exported zoo graphs (244-585 nodes) solve to
# proven optimality in 0.1-12.5 s; random DAGs with binding limits may hit the time limit from ~300.
MILP_MAX_NODES = 1000


@dataclass(frozen=True, kw_only=True)
class PartitionProblem:
    """A DAG in topological order, per-unit costs and limits. Indices: nodes 0..N-1, units 0..U-1."""

    names: tuple[str, ...]
    op_types: tuple[str, ...]
    unit_names: tuple[str, ...]
    compute_us: np.ndarray  # (N, U) µs, inf = unsupported
    weight_bytes: np.ndarray  # (N,) weights a node holds on its unit
    output_bytes: np.ndarray  # (N,) bytes of the node's outputs
    edges: np.ndarray  # (E, 2) int: producer, consumer (producer < consumer)
    edge_bytes: np.ndarray  # (E,)
    input_bytes: np.ndarray  # (N,) graph-input bytes a node reads (moved from the host)
    result_bytes: np.ndarray  # (N,) graph-output bytes a node writes (moved to the host)
    capacity_bytes: np.ndarray  # (U,)
    transfer_latency_us: np.ndarray  # (U, U), 0 on the diagonal
    transfer_us_per_byte: np.ndarray  # (U, U), 0 on the diagonal
    host: int = 0  # the unit graph inputs come from and outputs go to
    priority: tuple[int, ...] = ()  # ORT-style claim order per unit (lower first)
    modules: tuple[str, ...] = ()
    # (E,) int: the tensor each edge carries; edges with one id share one producer and one copy per
    # unit. None: the edges of one producer with equal bytes carry the same tensor.
    edge_values: np.ndarray | None = None

    @property
    def num_nodes(self) -> int:
        return len(self.names)

    @property
    def num_units(self) -> int:
        return len(self.unit_names)

    def transfer_cost(self, src: np.ndarray | int, dst: np.ndarray | int, nbytes: np.ndarray | float) -> Any:
        """µs to move ``nbytes`` from unit ``src`` to unit ``dst`` (0 when equal); broadcasts."""
        return self.transfer_latency_us[src, dst] + self.transfer_us_per_byte[src, dst] * nbytes

    def edge_groups(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The tensors the edges carry: (group of each edge (E,), producer of each group (G,), bytes
        of each group (G,)). A group is moved to a unit at most once."""
        if not len(self.edges):
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, np.zeros(0)
        if self.edge_values is not None:
            key = np.stack([self.edges[:, 0], np.asarray(self.edge_values, dtype=np.int64)], axis=1)
            _, first, group = np.unique(key, axis=0, return_index=True, return_inverse=True)
        else:
            key = np.stack([self.edges[:, 0].astype(float), self.edge_bytes.astype(float)], axis=1)
            _, first, group = np.unique(key, axis=0, return_index=True, return_inverse=True)
        group = np.asarray(group, dtype=np.int64).reshape(-1)
        return group, self.edges[first, 0].astype(np.int64), self.edge_bytes[first].astype(float)

    def last_use(self) -> np.ndarray:
        """Per node: the step of its output's last reader (itself when none; N for graph outputs)."""
        last = np.arange(self.num_nodes)
        if len(self.edges):
            np.maximum.at(last, self.edges[:, 0], self.edges[:, 1])
        return np.where(self.result_bytes > 0, self.num_nodes, last)

    def supported(self) -> np.ndarray:
        return np.isfinite(self.compute_us)


@dataclass(frozen=True)
class Evaluation:
    latency_us: float
    compute_us: float
    transfer_us: float
    memory_bytes: tuple[int, ...]  # peak per unit
    violations: tuple[str, ...]  # units over their limit, nodes on units that cannot run them

    @property
    def feasible(self) -> bool:
        return not self.violations


def residency(problem: PartitionProblem, assign: np.ndarray) -> np.ndarray:
    """(N, U) bool: node ``v``'s output is held on unit ``u`` (produced there or read there)."""
    n, u = problem.num_nodes, problem.num_units
    held = np.zeros((n, u), dtype=bool)
    held[np.arange(n), assign] = True
    if len(problem.edges):
        held[problem.edges[:, 0], assign[problem.edges[:, 1]]] = True
    return held


def memory_peaks(problem: PartitionProblem, assign: np.ndarray) -> np.ndarray:
    """Peak bytes per unit: its nodes' weights + the live outputs it holds, at the worst step."""
    n, nu = problem.num_nodes, problem.num_units
    if not n:
        return np.zeros(nu, np.int64)
    held_v, held_u = np.nonzero(residency(problem, assign))
    last = np.minimum(problem.last_use(), n - 1)
    diff = np.zeros((nu, n + 1))  # per unit: +bytes where an output appears, -bytes after its last use
    np.add.at(diff, (held_u, held_v), problem.output_bytes[held_v])
    np.add.at(diff, (held_u, last[held_v] + 1), -problem.output_bytes[held_v])
    activations = np.cumsum(diff[:, :n], axis=1).max(axis=1)
    weights = np.bincount(assign, weights=problem.weight_bytes, minlength=nu)
    return np.asarray(np.rint(activations + weights), dtype=np.int64)


def evaluate(problem: PartitionProblem, assign: np.ndarray) -> Evaluation:
    """Latency (compute + transfers) and per-unit memory of an assignment, and what it violates."""
    assign = np.asarray(assign, dtype=np.int64)
    n = problem.num_nodes
    compute = float(problem.compute_us[np.arange(n), assign].sum())
    transfer = edge_transfer_us(problem, assign)
    host = problem.host
    reads = problem.input_bytes > 0
    transfer += float(
        np.sum(problem.transfer_cost(host, assign[reads], problem.input_bytes[reads]) * (assign[reads] != host))
    )
    writes = problem.result_bytes > 0
    transfer += float(
        np.sum(problem.transfer_cost(assign[writes], host, problem.result_bytes[writes]) * (assign[writes] != host))
    )
    peaks = memory_peaks(problem, assign)
    violations = [
        f"{problem.unit_names[u]}: {int(peaks[u]):,} B > limit {int(problem.capacity_bytes[u]):,} B"
        for u in range(problem.num_units)
        if peaks[u] > problem.capacity_bytes[u]
    ]
    unsupported = int(np.sum(~np.isfinite(problem.compute_us[np.arange(n), assign])))
    if unsupported:
        violations.append(f"{unsupported} node(s) on a unit that cannot run them")
    return Evaluation(compute + transfer, compute, transfer, tuple(int(p) for p in peaks), tuple(violations))


def edge_transfer_us(problem: PartitionProblem, assign: np.ndarray) -> float:
    """µs of moving tensors between units: each tensor once to each unit, other than its
    producer's, where some reader of it runs."""
    if not len(problem.edges):
        return 0.0
    group, producer, nbytes = problem.edge_groups()
    src = assign[producer][group]
    dst = assign[problem.edges[:, 1]]
    moved = src != dst
    keys = np.unique(group[moved] * problem.num_units + dst[moved])  # one copy per (tensor, unit)
    g, w = keys // problem.num_units, keys % problem.num_units
    return float(np.sum(problem.transfer_cost(assign[producer[g]], w, nbytes[g])))


@dataclass(frozen=True)
class Solution:
    method: str
    assign: np.ndarray
    evaluation: Evaluation
    exact: bool
    detail: dict[str, Any] = field(default_factory=dict)


def is_chain(problem: PartitionProblem) -> bool:
    """Every edge joins consecutive nodes: the DP's transfer terms are then all it needs."""
    return bool(np.all(problem.edges[:, 1] == problem.edges[:, 0] + 1)) if len(problem.edges) else True


def chain_dp(problem: PartitionProblem) -> np.ndarray:
    """Exact minimum latency on a chain, ignoring memory (the caller checks it)."""
    n, u = problem.num_nodes, problem.num_units
    host = problem.host
    step = np.zeros(n)  # bytes moved from node i-1 to node i
    for (a, b), nbytes in zip(problem.edges.tolist(), problem.edge_bytes.tolist(), strict=True):
        step[b] += nbytes
        assert b == a + 1
    units = np.arange(u)
    local = problem.compute_us.copy()  # (n, U) compute + host transfers of the node itself
    local += np.where(
        problem.input_bytes[:, None] > 0,
        problem.transfer_cost(host, units[None, :], problem.input_bytes[:, None]) * (units[None, :] != host),
        0,
    )
    local += np.where(
        problem.result_bytes[:, None] > 0,
        problem.transfer_cost(units[None, :], host, problem.result_bytes[:, None]) * (units[None, :] != host),
        0,
    )
    cost = local[0].copy()
    back = np.zeros((n, u), dtype=np.int64)
    for i in range(1, n):
        move = problem.transfer_cost(units[:, None], units[None, :], step[i]) * (units[:, None] != units[None, :])
        if step[i] == 0:
            move = np.zeros((u, u))
        total = cost[:, None] + move  # (from, to)
        back[i] = np.argmin(total, axis=0)
        cost = total[back[i], units] + local[i]
    assign = np.zeros(n, dtype=np.int64)
    assign[-1] = int(np.argmin(cost)) if n else 0
    for i in range(n - 1, 0, -1):
        assign[i - 1] = back[i, assign[i]]
    if n and not math.isfinite(float(cost.min())):
        assign[:] = problem.host
    return assign
