"""Partitioning across compute units: the exact solver against brute force on random DAGs, the
baselines, memory limits, and the ONNX/CLI path."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memwarden.plan.partition import PartitionProblem, chain_dp, evaluate
from memwarden.plan.partition_baselines import baselines
from memwarden.plan.partition_milp import solve_milp
from memwarden.plan.partition_solve import solve


def random_problem(seed: int, n: int, nu: int, *, chain: bool = False, tight: bool = True) -> PartitionProblem:
    rng = np.random.default_rng(seed)
    compute = rng.uniform(1, 100, size=(n, nu))
    compute[:, 1:] *= rng.uniform(0.05, 2.0, size=(1, nu - 1))  # accelerators: faster or slower overall
    unsupported = rng.random((n, nu)) < 0.25
    unsupported[:, 0] = False  # unit 0 is the host: it runs everything
    compute[unsupported] = math.inf
    if chain:
        edges = np.array([(i, i + 1) for i in range(n - 1)], dtype=np.int64).reshape(-1, 2)
    else:
        pairs = [
            (a, b) for b in range(1, n) for a in rng.choice(b, size=min(b, int(rng.integers(1, 3))), replace=False)
        ]
        edges = np.array(sorted(set(pairs)), dtype=np.int64).reshape(-1, 2)
    weights = rng.integers(0, 1000, size=n).astype(float)
    outputs = rng.integers(1, 500, size=n).astype(float)
    capacity = np.full(nu, 1e12)
    if tight:
        capacity[1:] = rng.uniform(0.2, 0.8, size=nu - 1) * (weights.sum() + outputs.sum())
    lat = rng.uniform(1, 20, size=(nu, nu))
    lat = (lat + lat.T) / 2
    np.fill_diagonal(lat, 0)
    per_byte = rng.uniform(0.001, 0.05, size=(nu, nu))
    np.fill_diagonal(per_byte, 0)
    inputs = np.zeros(n)
    inputs[0] = 100
    results = np.zeros(n)
    results[-1] = 50
    return PartitionProblem(
        names=tuple(f"n{i}" for i in range(n)),
        op_types=("Op",) * n,
        unit_names=tuple(f"u{u}" for u in range(nu)),
        compute_us=compute,
        weight_bytes=weights,
        output_bytes=outputs,
        edges=edges,
        edge_bytes=outputs[edges[:, 0]] if len(edges) else np.zeros(0),
        input_bytes=inputs,
        result_bytes=results,
        capacity_bytes=capacity,
        transfer_latency_us=lat,
        transfer_us_per_byte=per_byte,
        host=0,
        priority=tuple(range(nu - 1, -1, -1)),
    )


def brute_force(problem: PartitionProblem) -> float:
    """Depth-first search over every assignment, pruned by a lower bound; exact."""
    n, nu = problem.num_nodes, problem.num_units
    best = [math.inf]
    assign = np.zeros(n, dtype=np.int64)
    min_rest = np.concatenate([np.cumsum(problem.compute_us.min(axis=1)[::-1])[::-1], [0.0]])
    group, _, _ = problem.edge_groups()
    incoming: list[list[tuple[int, int, float]]] = [[] for _ in range(n)]  # (producer, tensor, bytes)
    readers: list[list[int]] = [[] for _ in range(len(group) and int(group.max()) + 1)]
    for (a, b), g, nbytes in zip(problem.edges.tolist(), group.tolist(), problem.edge_bytes.tolist(), strict=True):
        incoming[b].append((a, g, nbytes))
        readers[g].append(b)
    weights_on = np.zeros(nu)

    def visit(v: int, partial: float) -> None:
        if partial + min_rest[v] >= best[0] - 1e-9:
            return
        if v == n:
            ev = evaluate(problem, assign)
            if ev.feasible:
                best[0] = min(best[0], ev.latency_us)
            return
        for u in range(nu):
            cost = problem.compute_us[v, u]
            if not math.isfinite(cost) or weights_on[u] + problem.weight_bytes[v] > problem.capacity_bytes[u]:
                continue
            for a, g, nbytes in incoming[v]:  # a copy to u unless an earlier reader on u made it
                if assign[a] != u and not any(r < v and assign[r] == u for r in readers[g]):
                    cost += problem.transfer_cost(int(assign[a]), u, nbytes)
            if problem.input_bytes[v] and u != problem.host:
                cost += problem.transfer_cost(problem.host, u, problem.input_bytes[v])
            if problem.result_bytes[v] and u != problem.host:
                cost += problem.transfer_cost(u, problem.host, problem.result_bytes[v])
            assign[v] = u
            weights_on[u] += problem.weight_bytes[v]
            visit(v + 1, partial + cost)
            weights_on[u] -= problem.weight_bytes[v]

    visit(0, 0.0)
    return best[0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(2, 12), nu=st.integers(2, 4), chain=st.booleans())
def test_equals_brute_force_on_random_dags(seed: int, n: int, nu: int, chain: bool) -> None:
    problem = random_problem(seed, n, nu, chain=chain)
    solution = solve(problem)
    optimum = brute_force(problem)
    assert solution.evaluation.feasible
    assert solution.exact
    assert solution.evaluation.latency_us == pytest.approx(optimum, rel=1e-6, abs=1e-6)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 40), nu=st.integers(2, 4))
def test_never_violates_memory_and_beats_every_feasible_baseline(seed: int, n: int, nu: int) -> None:
    problem = random_problem(seed, n, nu)
    solution = solve(problem)
    assert solution.evaluation.feasible, solution.evaluation.violations
    for base in baselines(problem):
        if base.evaluation.feasible:
            assert solution.evaluation.latency_us <= base.evaluation.latency_us + 1e-6, base.method


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 25), nu=st.integers(2, 4))
def test_local_search_stops_where_no_single_move_helps(seed: int, n: int, nu: int) -> None:
    """The local search's move costs (computed locally) follow the evaluation's transfer rule: it
    never ends slower than its start, and no single move of its answer lowers the evaluated latency."""
    from memwarden.plan.partition_search import local_search

    problem = random_problem(seed, n, nu, tight=False)
    rng = np.random.default_rng(seed)
    start = np.array([u if problem.supported()[v, u] else 0 for v, u in enumerate(rng.integers(0, nu, n))])
    found = local_search(problem, start, budget_s=60)  # converges in milliseconds; the budget only caps it
    best = found.evaluation.latency_us
    assert best <= evaluate(problem, start).latency_us + 1e-6
    for v in range(n):
        for u in np.flatnonzero(problem.supported()[v]).tolist():
            moved = found.assign.copy()
            moved[v] = u
            assert evaluate(problem, moved).latency_us >= best - 1e-6, (v, u)


def test_chain_dp_matches_milp_without_memory_limits() -> None:
    for seed in range(10):
        problem = random_problem(seed, 30, 3, chain=True, tight=False)
        dp = evaluate(problem, chain_dp(problem)).latency_us
        milp, optimal = solve_milp(problem)
        assert optimal
        assert dp == pytest.approx(evaluate(problem, milp).latency_us, rel=1e-9)


def test_large_graphs_fall_back_to_local_search() -> None:
    problem = random_problem(1, 600, 3)
    solution = solve(problem, max_exact_nodes=300)
    assert solution.method == "local-search" and not solution.exact
    assert solution.evaluation.feasible
    greedy = [b for b in baselines(problem) if b.method in ("all-cpu", "affinity-greedy") and b.evaluation.feasible]
    assert all(solution.evaluation.latency_us <= b.evaluation.latency_us + 1e-6 for b in greedy)


@pytest.fixture(scope="module")
def vision_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("onnx")
    from memwarden.record.onnx.export import export_zoo

    return export_zoo("llava", tmp_path_factory.mktemp("part"), parts=("vision",))["vision"]


@pytest.mark.parametrize("device", ["galaxy-s24-ultra-12gb", "jetson-orin-nx-16gb", "iphone-15-pro"])
def test_cli_partition_on_every_profile(
    vision_onnx: Path, device: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from memwarden.cli import main

    assert main(["partition", str(vision_onnx), "--device-profile", device, "--dtype", "fp16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["solution"]["feasible"] and data["solution"]["violations"] == []
    for base in data["baselines"]:
        if base["feasible"]:
            assert data["solution"]["latency_us"] <= base["latency_us"] + 1e-6
    html = tmp_path / "p.html"
    assert main(["partition", str(vision_onnx), "--device-profile", device, "--html", str(html)]) == 0
    assert "<table" in html.read_text()
    assert main(["partition", str(vision_onnx), "--device-profile", device]) == 0
    assert device in capsys.readouterr().out or "cpu" in capsys.readouterr().out


def test_cli_partition_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memwarden.cli import main

    junk = tmp_path / "x.onnx"
    junk.write_bytes(b"junk" * 5)
    assert main(["partition", str(junk), "--device-profile", "iphone-15-pro"]) == 2
    assert main(["partition", str(junk), "--device-profile", "t4-16gb"]) == 2
    capsys.readouterr()


def test_exported_graphs_of_hundreds_of_nodes_are_solved_exactly(tmp_path: Path) -> None:
    """Qwen2-VL's vision tower (small, 387 nodes): the exact program proves its optimum on the
    phone's three units, and the local search alone does no better. (Before copies were shared
    between readers on one unit, the local search missed this optimum; it now reaches it.)"""
    pytest.importorskip("onnx")
    from memwarden.models.compute_units import load_compute_units
    from memwarden.plan.partition_onnx import load_problem
    from memwarden.record.onnx.export import export_zoo

    path = export_zoo("qwen2-vl", tmp_path, size="small", parts=("vision",))["vision"]
    problem = load_problem(path, load_compute_units("galaxy-s24-ultra-12gb"), dtype="fp16")
    assert problem.num_nodes > 300
    exact = solve(problem)
    searched = solve(problem, max_exact_nodes=0)
    assert exact.method == "milp" and exact.exact and exact.evaluation.feasible
    assert not searched.exact and exact.evaluation.latency_us <= searched.evaluation.latency_us + 1e-6


def _fan_out() -> PartitionProblem:
    """Node 0 (host only) writes one 100-byte tensor that nodes 1 and 2 both read; each reader
    takes 10 µs on the host and 4 on the accelerator, and a copy host -> accelerator costs
    5 + 100 x 0.02 = 7 µs. Moving both readers saves 12 µs of compute for one 7 µs copy; charged
    per reader (14 µs) it would not pay."""
    inf = math.inf
    return PartitionProblem(
        names=("n0", "n1", "n2"),
        op_types=("Op",) * 3,
        unit_names=("cpu", "acc"),
        compute_us=np.array([[1.0, inf], [10.0, 4.0], [10.0, 4.0]]),
        weight_bytes=np.zeros(3),
        output_bytes=np.array([100.0, 10.0, 10.0]),
        edges=np.array([[0, 1], [0, 2]], dtype=np.int64),
        edge_bytes=np.array([100.0, 100.0]),
        input_bytes=np.zeros(3),
        result_bytes=np.zeros(3),
        capacity_bytes=np.array([1e12, 1e12]),
        transfer_latency_us=np.array([[0.0, 5.0], [5.0, 0.0]]),
        transfer_us_per_byte=np.array([[0.0, 0.02], [0.02, 0.0]]),
        host=0,
    )


def test_a_tensor_is_moved_once_per_destination_unit() -> None:
    from memwarden.plan.partition_baselines import affinity_greedy
    from memwarden.plan.partition_search import local_search

    problem = _fan_out()
    both = evaluate(problem, np.array([0, 1, 1]))
    assert both.transfer_us == pytest.approx(7.0) and both.latency_us == pytest.approx(1 + 4 + 4 + 7)
    assert evaluate(problem, np.array([0, 1, 0])).transfer_us == pytest.approx(7.0)
    assert evaluate(problem, np.array([0, 0, 0])).latency_us == pytest.approx(21.0)
    # the exact solvers and the brute force agree on the shared copy
    solution = solve(problem)
    assert solution.assign.tolist() == [0, 1, 1] and solution.evaluation.latency_us == pytest.approx(16.0)
    assert brute_force(problem) == pytest.approx(16.0)
    milp, optimal = solve_milp(problem)
    assert optimal and milp.tolist() == [0, 1, 1]
    # the local search counts the copy another reader already has: from [0, 0, 1], node 1 joins node 2
    # on the accelerator for 4 µs (charged its own copy, 11 µs, it would stay and node 2 come back)
    assert local_search(problem, np.array([0, 0, 1])).assign.tolist() == [0, 1, 1]
    # affinity-greedy is myopic: node 1 alone does not pay (4 + 7 > 10), so node 2 finds no copy to share
    assert affinity_greedy(problem).assign.tolist() == [0, 0, 0]
    # two different tensors of one producer, read on the same unit, are two copies
    two = dataclasses.replace(problem, edge_values=np.array([0, 1]))
    assert evaluate(two, np.array([0, 1, 1])).transfer_us == pytest.approx(14.0)
    assert solve(two).assign.tolist() == [0, 0, 0]


def test_onnx_edges_carry_one_tensor_each(tmp_path: Path) -> None:
    """A graph tensor read by two nodes is one group: placing both readers on one unit pays one copy."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from memwarden.models.compute_units import load_compute_units
    from memwarden.plan.partition_onnx import load_problem

    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="/a/Relu"),
        helper.make_node("Sigmoid", ["a"], ["b"], name="/b/Sigmoid"),
        helper.make_node("Tanh", ["a"], ["c"], name="/c/Tanh"),
        helper.make_node("Add", ["b", "c"], ["y"], name="/y/Add"),
    ]
    graph = helper.make_graph(
        nodes,
        "fan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
    )
    path = tmp_path / "fan.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    problem = load_problem(path, load_compute_units("jetson-orin-nx-16gb"))
    group, producer, nbytes = problem.edge_groups()
    assert len(problem.edges) == 4 and len(nbytes) == 3  # a (read twice), b, c
    assert nbytes.tolist() == [64 * 64 * 4] * 3
    assign = np.zeros(problem.num_nodes, dtype=np.int64)
    gpu = problem.unit_names.index("gpu")
    assign[[1, 2]] = gpu
    moved = evaluate(problem, assign).transfer_us
    one_copy = problem.transfer_cost(0, gpu, 64 * 64 * 4)
    assert moved == pytest.approx(one_copy + 2 * problem.transfer_cost(gpu, 0, 64 * 64 * 4))
