"""The exact partitioner: a mixed-integer program solved by HiGHS (``scipy.optimize.milp``).

Variables, per node ``v`` and unit ``u``: ``x[v,u]`` (binary: v runs on u), ``r[v,u]`` (v's
output is held on u: r >= x of v and of each consumer), and per tensor ``g`` (the edges' groups,
``PartitionProblem.edge_groups``) and ordered pair ``u != w``: ``z[g,u,w]`` >= x[a,u] + x[b,w] - 1
for every edge ``(a, b)`` carrying g (the tensor is moved u -> w once, whichever of its readers on
w asks). Objective: compute + host transfers (linear in x) + sum of z times the pair's transfer
time. Memory: at every step
``t`` and unit ``u``, weights on u + bytes of live outputs held on u <= the unit's limit; steps
whose live set another step's contains are dropped, and units that cannot overflow even with
everything on them get no rows.
"""

from __future__ import annotations

import numpy as np

from memwarden.plan.partition import PartitionProblem

__all__ = ["solve_milp"]


def solve_milp(problem: PartitionProblem, *, time_limit_s: float = 30.0) -> tuple[np.ndarray, bool]:
    """(assignment, proven optimal). Without a feasible point it returns all-on-host, not optimal."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    n, nu = problem.num_nodes, problem.num_units
    units = np.arange(nu)
    supported = problem.supported()
    host = problem.host
    # -- objective on x: compute + moving graph inputs in / outputs out
    cx = np.where(supported, problem.compute_us, 0.0)
    cx = cx + np.where(
        problem.input_bytes[:, None] > 0,
        problem.transfer_cost(host, units[None, :], problem.input_bytes[:, None]) * (units[None, :] != host),
        0.0,
    )
    cx = cx + np.where(
        problem.result_bytes[:, None] > 0,
        problem.transfer_cost(units[None, :], host, problem.result_bytes[:, None]) * (units[None, :] != host),
        0.0,
    )
    pairs = [(u, w) for u in range(nu) for w in range(nu) if u != w]
    group, _, group_bytes = problem.edge_groups()
    ne, npairs = len(problem.edges), len(pairs)
    nx, nr, nz = n * nu, n * nu, len(group_bytes) * npairs
    total = nx + nr + nz
    c = np.zeros(total)
    c[:nx] = cx.ravel()
    pu = np.array([p[0] for p in pairs], dtype=np.int64)
    pw = np.array([p[1] for p in pairs], dtype=np.int64)
    if ne:
        c[nx + nr :] = problem.transfer_cost(pu[None, :], pw[None, :], group_bytes[:, None]).ravel()

    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lo: list[np.ndarray] = []
    hi: list[np.ndarray] = []
    row = 0

    def add(r: np.ndarray, col: np.ndarray, v: np.ndarray, low: np.ndarray, high: np.ndarray, count: int) -> None:
        nonlocal row
        rows.append(r + row)
        cols.append(col)
        vals.append(v)
        lo.append(low)
        hi.append(high)
        row += count

    xi = np.arange(nx).reshape(n, nu)
    ri = nx + np.arange(nr).reshape(n, nu)
    # one unit per node
    add(np.repeat(np.arange(n), nu), xi.ravel(), np.ones(nx), np.ones(n), np.ones(n), n)
    # r[v,u] >= x[v,u]  ->  x - r <= 0
    k = np.arange(nx)
    add(
        np.concatenate([k, k]),
        np.concatenate([xi.ravel(), ri.ravel()]),
        np.concatenate([np.ones(nx), -np.ones(nx)]),
        np.full(nx, -np.inf),
        np.zeros(nx),
        nx,
    )
    if ne:
        a, b = problem.edges[:, 0], problem.edges[:, 1]
        # r[a,u] >= x[b,u]
        m = ne * nu
        k = np.arange(m)
        add(
            np.concatenate([k, k]),
            np.concatenate([xi[b].ravel(), ri[a].ravel()]),
            np.concatenate([np.ones(m), -np.ones(m)]),
            np.full(m, -np.inf),
            np.zeros(m),
            m,
        )
        # x[a,u] + x[b,w] - z[g(e),u,w] <= 1
        m = ne * npairs
        k = np.arange(m)
        zi = (nx + nr + group[:, None] * npairs + np.arange(npairs)[None, :]).ravel()
        xa = xi[a][:, pu].ravel()
        xb = xi[b][:, pw].ravel()
        add(
            np.concatenate([k, k, k]),
            np.concatenate([xa, xb, zi]),
            np.concatenate([np.ones(m), np.ones(m), -np.ones(m)]),
            np.full(m, -np.inf),
            np.ones(m),
            m,
        )
    # memory rows
    live = _live_steps(problem)
    weights = problem.weight_bytes
    for u in range(nu):
        worst = float(weights.sum()) + float(max((problem.output_bytes[s].sum() for s in live), default=0.0))
        if worst <= problem.capacity_bytes[u]:
            continue
        for s in live:
            cnt = len(s) + n
            add(
                np.zeros(cnt, dtype=np.int64),
                np.concatenate([ri[s, u], xi[:, u]]),
                np.concatenate([problem.output_bytes[s].astype(float), weights.astype(float)]),
                np.array([-np.inf]),
                np.array([float(problem.capacity_bytes[u])]),
                1,
            )
    matrix = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(row, total)
    ).tocsr()
    upper = np.ones(total)
    upper[:nx] = supported.ravel().astype(float)
    integrality = np.zeros(total)
    integrality[:nx] = 1
    result = milp(
        c,
        constraints=LinearConstraint(matrix, np.concatenate(lo), np.concatenate(hi)),
        integrality=integrality,
        bounds=Bounds(np.zeros(total), upper),
        options={"time_limit": time_limit_s, "mip_rel_gap": 0.0, "disp": False},
    )
    if result.x is None:
        return np.full(n, host, dtype=np.int64), False
    x = np.asarray(result.x[:nx]).reshape(n, nu)
    return np.argmax(x, axis=1).astype(np.int64), bool(result.status == 0)


def _live_steps(problem: PartitionProblem) -> list[np.ndarray]:
    """Per step, the nodes whose outputs are live; steps contained in a later one are dropped."""
    n = problem.num_nodes
    last = np.minimum(problem.last_use(), n - 1)
    order = np.arange(n)
    steps: list[np.ndarray] = []
    previous: set[int] = set()
    for t in range(n):
        alive = order[(order <= t) & (last >= t)]
        current = set(alive.tolist())
        if steps and previous <= current:
            steps[-1] = alive  # the earlier set is inside this one
        elif not (current <= previous):
            steps.append(alive)
        previous = current
    return steps
