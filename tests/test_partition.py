"""Partitioning across compute units: the exact solver against brute force on random DAGs, the
baselines, memory limits, and the ONNX/CLI path."""

from __future__ import annotations

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
        names=tuple(f"n{i}" for i in range(n)), op_types=("Op",) * n, unit_names=tuple(f"u{u}" for u in range(nu)),
        compute_us=compute, weight_bytes=weights, output_bytes=outputs, edges=edges,
        edge_bytes=outputs[edges[:, 0]] if len(edges) else np.zeros(0), input_bytes=inputs, result_bytes=results,
        capacity_bytes=capacity, transfer_latency_us=lat, transfer_us_per_byte=per_byte, host=0,
        priority=tuple(range(nu - 1, -1, -1)),
    )  # fmt: skip


def brute_force(problem: PartitionProblem) -> float:
    """Depth-first search over every assignment, pruned by a lower bound; exact."""
    n, nu = problem.num_nodes, problem.num_units
    best = [math.inf]
    assign = np.zeros(n, dtype=np.int64)
    min_rest = np.concatenate([np.cumsum(problem.compute_us.min(axis=1)[::-1])[::-1], [0.0]])
    incoming: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for (a, b), nbytes in zip(problem.edges.tolist(), problem.edge_bytes.tolist(), strict=True):
        incoming[b].append((a, nbytes))
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
            for a, nbytes in incoming[v]:
                if assign[a] != u:
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
    from memwarden.capture.onnx.export import export_zoo

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
    """Qwen2-VL's vision tower (small, 387 nodes): the exact program proves its optimum, which the
    local search alone misses on the phone's three units."""
    pytest.importorskip("onnx")
    from memwarden.capture.onnx.export import export_zoo
    from memwarden.models.compute_units import load_compute_units
    from memwarden.plan.partition_onnx import load_problem

    path = export_zoo("qwen2-vl", tmp_path, size="small", parts=("vision",))["vision"]
    problem = load_problem(path, load_compute_units("galaxy-s24-ultra-12gb"), dtype="fp16")
    assert problem.num_nodes > 300
    exact = solve(problem)
    searched = solve(problem, max_exact_nodes=0)
    assert exact.method == "milp" and exact.exact and exact.evaluation.feasible
    assert not searched.exact and exact.evaluation.latency_us < searched.evaluation.latency_us
