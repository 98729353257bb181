"""The dynamic budget: recorded traces drive it the expected way, and for any log the headroom
invariant and the hysteresis rule of runtime/budget.py's docstring hold exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import run_cli
from memwarden.errors import InputError
from memwarden.govern.budget import (
    BudgetController,
    BudgetDecision,
    BudgetPolicy,
    DefaultPolicy,
    FixedPolicy,
    Signals,
    make_policy,
    register_policy,
    replay,
)
from memwarden.govern.telemetry import TelemetrySample
from memwarden.govern.telemetry_log import load_log, parse_jsonl
from memwarden.models.devices import load_profile

EXAMPLES = Path(__file__).parent.parent / "examples" / "telemetry"
MIB, GIB = 1 << 20, 1 << 30


def check_invariants(
    samples: list[TelemetrySample],
    decisions: list[BudgetDecision],
    policy: BudgetPolicy,
    *,
    cap_bytes: int | None = None,
    in_use: list[int] | None = None,
) -> None:
    """Exactly what the module docstring promises."""
    available = None
    prev_budget, last_change_s = None, None
    for i, (s, d) in enumerate(zip(samples, decisions, strict=True)):
        if s.mem_available_bytes is not None:
            available = s.mem_available_bytes
        used = in_use[i] if in_use else 0
        assert d.budget_bytes >= 0
        if available is not None:
            assert d.budget_bytes <= max(0, available + used - policy.min_headroom_bytes), (i, s, d)
        if cap_bytes is not None:
            assert d.budget_bytes <= cap_bytes
        elif available is None:
            assert d.budget_bytes == 0  # nothing measured and no cap: nothing to hand out
        assert d.changed == (d.budget_bytes != prev_budget)
        if d.forced:
            assert prev_budget is not None and prev_budget > d.ceiling_bytes >= d.budget_bytes
        elif d.changed and prev_budget is not None:
            assert d.t_s - last_change_s >= policy.hysteresis_s, (i, d)
            step = abs(d.budget_bytes - prev_budget)
            # a move is worth making from min_change_bytes (capped at a fifth of the budget) and min_change_fraction
            assert step >= max(
                policy.min_change_fraction * prev_budget, min(policy.min_change_bytes, 0.2 * prev_budget)
            )
        if d.changed:
            last_change_s = d.t_s
        prev_budget = d.budget_bytes


def run(name: str, **kwargs: object) -> tuple[list[TelemetrySample], list[BudgetDecision], BudgetController]:
    samples = load_log(EXAMPLES / f"{name}.jsonl")
    controller = BudgetController(**kwargs)  # type: ignore[arg-type]
    decisions = replay(samples, controller)
    check_invariants(samples, decisions, controller.policy, cap_bytes=controller.cap_bytes)
    return samples, decisions, controller


def test_cold_trace_gives_the_most() -> None:
    samples, decisions, _ = run("cold")
    final = decisions[-1].budget_bytes
    avail = min(s.mem_available_bytes or 0 for s in samples)
    assert avail - 512 * MIB - 200 * MIB < final <= avail - 512 * MIB  # all of it, bar margins
    assert sum(d.changed for d in decisions) <= 2  # a steady device: the budget holds still


def test_hot_trace_gives_less_than_cold() -> None:
    cold = run("cold")[1][-1].budget_bytes
    _, hot, _ = run("hot")
    assert hot[-1].weights["temp"] < 0.6
    assert 0.45 * cold < hot[-1].budget_bytes < 0.62 * cold


def test_power_capped_trace() -> None:
    _, decisions, _ = run("power_capped")
    start, mid, end = decisions[5], decisions[60], decisions[-1]
    assert mid.weights["power"] < 0.9 and mid.weights["fps"] < 0.9  # at the limit, frames sagging
    assert end.weights["power"] < 0.9 and end.weights["fps"] == 1.0  # 60 s on, the lower fps is the norm
    assert end.budget_bytes < 0.75 * start.budget_bytes


def test_low_memory_trace_goes_to_zero_and_recovers() -> None:
    samples, decisions, _ = run("low_memory")
    assert min(d.budget_bytes for d in decisions) == 0  # available fell below the headroom
    assert decisions[-1].budget_bytes > 400 * MIB  # memory came back, so did the budget
    assert sum(d.forced for d in decisions) <= 3  # the trend projection keeps forced drops rare


def test_thermal_event_halves_the_budget_then_restores_it() -> None:
    _, decisions, _ = run("thermal_event")
    before = decisions[39].budget_bytes
    during = min(d.budget_bytes for d in decisions[80:130])
    assert during == pytest.approx(before / 2, rel=0.06)
    assert decisions[-1].budget_bytes == pytest.approx(before, rel=0.02)


def test_cap_and_device_profile() -> None:
    _, decisions, controller = run("cold", cap_bytes="2GiB")
    assert max(d.budget_bytes for d in decisions) == 2 * GIB
    jetson = BudgetController.from_device_profile("jetson-orin-nano-8gb")
    # the profile's usable memory: what the OS leaves (8 GiB - 1.5 GiB) or its kill limit, the smaller
    usable = load_profile("jetson-orin-nano-8gb").usable_bytes
    assert 6 * GIB <= usable <= 8 * GIB - 1536 * MIB
    assert jetson.cap_bytes == usable
    assert jetson.budget_bytes == usable - 512 * MIB  # before telemetry: the profile's usable memory
    assert jetson.update(TelemetrySample(t_s=0, temp_c=30.0)) <= usable - 512 * MIB
    assert jetson.update(TelemetrySample(t_s=1, mem_available_bytes=2 * GIB)) <= 2 * GIB - 512 * MIB
    assert BudgetController.from_device_profile("jetson-orin-nano-8gb", cap_bytes="6GiB").cap_bytes == 6 * GIB


def test_in_use_bytes_count_toward_the_budget() -> None:
    # A session that already holds 3 GiB sees 1 GiB available: its budget covers what it holds.
    c = BudgetController()
    budget = c.update(TelemetrySample(t_s=0, mem_available_bytes=1 * GIB), in_use_bytes=3 * GIB)
    assert 3 * GIB < budget <= 4 * GIB - 512 * MIB


def test_time_never_runs_backwards_for_a_live_controller() -> None:
    c = BudgetController()
    c.update(TelemetrySample(t_s=100, mem_available_bytes=4 * GIB))
    d = c.decide(TelemetrySample(t_s=1, mem_available_bytes=8 * GIB))
    assert d.t_s == 100 and not d.changed  # not a way around hysteresis


def test_policies_are_pluggable_and_configurable() -> None:
    policy = make_policy("default", {"min_headroom_bytes": "1GiB", "hysteresis_s": "10", "target_fps": "none"})
    assert isinstance(policy, DefaultPolicy) and policy.min_headroom_bytes == GIB and policy.hysteresis_s == 10
    assert policy.to_json()["name"] == "default" and policy.to_json()["min_headroom_bytes"] == GIB
    for name, params in [("nope", {}), ("default", {"bogus": 1}), ("default", {"hysteresis_s": "-1"})]:
        with pytest.raises(InputError):
            make_policy(name, params)

    @register_policy
    class Halve(BudgetPolicy):
        name = "halve-test"

        def weights(self, signals: Signals) -> dict[str, float]:
            return {"half": 0.5}

    c = BudgetController(make_policy("halve-test"))
    budget = c.update(TelemetrySample(t_s=0, mem_available_bytes=4 * GIB + 512 * MIB))
    assert budget == pytest.approx(2 * GIB, rel=0.03)

    fixed = BudgetController(FixedPolicy(budget_bytes=6 * GIB))
    assert fixed.update(TelemetrySample(t_s=0, mem_available_bytes=4 * GIB)) <= 4 * GIB - 512 * MIB


# -- any log: the invariants --------------------------------------------------------------------

_maybe = st.one_of(st.none(), st.just(math.nan))
_record = st.fixed_dictionaries(
    {"t": st.one_of(st.integers(0, 120), st.floats(0, 120, allow_nan=False))},
    optional={
        "mem_available_bytes": st.one_of(_maybe, st.integers(0, 16 * GIB)),
        "temp_c": st.one_of(_maybe, st.floats(-20, 110)),
        "power_w": st.one_of(_maybe, st.floats(0, 60)),
        "power_limit_w": st.one_of(_maybe, st.floats(1, 60)),
        "fps": st.one_of(_maybe, st.floats(0, 120)),
    },
)
_policy = st.builds(
    DefaultPolicy,
    min_headroom_bytes=st.integers(0, 2 * GIB),
    hysteresis_s=st.floats(0, 30),
    window_s=st.floats(0.5, 60),
    min_change_fraction=st.floats(0, 0.3),
    noise_margin_bytes=st.integers(0, 256 * MIB),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_record, max_size=60),
    _policy,
    st.one_of(st.none(), st.integers(0, 8 * GIB)),
)
def test_invariants_over_random_logs(records: list[dict], policy: DefaultPolicy, cap: int | None) -> None:
    lines = [json.dumps(r) for r in records]  # NaN is written as the NaN literal, as Python loggers do
    samples = parse_jsonl(lines)
    assert [s.t_s for s in samples] == sorted(s.t_s for s in samples)
    controller = BudgetController(policy, cap_bytes=cap)
    check_invariants(samples, replay(samples, controller), policy, cap_bytes=cap)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 100), st.integers(0, 8 * GIB), st.integers(0, 4 * GIB)), min_size=1, max_size=40)
)
def test_invariants_live_with_in_use_and_unsorted_time(rows: list[tuple[float, int, int]]) -> None:
    controller = BudgetController()
    samples, decisions, used = [], [], []
    clock = -math.inf
    for t, avail, in_use in rows:
        s = TelemetrySample(t_s=t, mem_available_bytes=avail)
        decisions.append(controller.decide(s, in_use_bytes=in_use))
        clock = max(clock, t)
        samples.append(TelemetrySample(t_s=clock, mem_available_bytes=avail))
        used.append(in_use)
    check_invariants(samples, decisions, controller.policy, in_use=used)


# -- CLI -----------------------------------------------------------------------------------------


def test_cli_replay_json() -> None:
    proc = run_cli("telemetry", "--replay", str(EXAMPLES / "thermal_event.jsonl"), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    policy = out["policy"]
    assert policy["name"] == "default" and policy["min_headroom_bytes"] == 512 * MIB and policy["hysteresis_s"] == 5
    assert len(out["samples"]) == 200
    for row in out["samples"]:
        assert {"t", "budget_bytes", "mem_available_bytes", "forced"} <= set(row)
        assert row["budget_bytes"] <= row["mem_available_bytes"] - policy["min_headroom_bytes"]
    assert out["summary"]["changes"] == sum(r["changed"] for r in out["samples"])


def test_cli_replay_table_and_params() -> None:
    proc = run_cli(
        "telemetry", "--replay", str(EXAMPLES / "hot.jsonl"), "--set", "min_headroom_bytes=1GiB", "--budget", "1GiB"
    )
    assert proc.returncode == 0, proc.stderr
    assert "min headroom 1.0 GiB" in proc.stdout and "cap 1.0 GiB" in proc.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--replay", "{tmp}/bad.jsonl"],
        ["--replay", "{tmp}/missing.jsonl"],
        ["--replay", str(EXAMPLES / "hot.jsonl"), "--set", "bogus=1"],
        ["--replay", str(EXAMPLES / "hot.jsonl"), "--policy", "nope"],
        ["--replay", str(EXAMPLES / "hot.jsonl"), "--budget", "lots"],
    ],
)
def test_cli_errors_are_one_line(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "bad.jsonl").write_text('{"t": 0}\n{"t": 1, "temp_c": "hot"}\n')
    proc = run_cli("telemetry", *(a.format(tmp=tmp_path) for a in args))
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memwarden telemetry: error:") and "Traceback" not in proc.stderr
    if "bad.jsonl" in args[1]:
        assert "line 2" in lines[0]


def test_cli_live() -> None:
    proc = run_cli("telemetry", "--json", "--count", "2", "--interval", "0.05", "--device", "jetson-orin-nano-8gb")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "psutil" in out["sources"] and len(out["samples"]) == 2
    assert all(r["budget_bytes"] <= out["cap_bytes"] for r in out["samples"])
    proc = run_cli("telemetry")
    assert proc.returncode == 0 and "budget" in proc.stdout


def test_soft_signals_scale_the_cap_down_to_the_floor_memory_can_go_lower() -> None:
    """Temperature alone (no memory signal) scales the cap, never below the session's floor; a small
    budget still follows a 20 % cut (min_change_bytes is capped at a fifth of the budget)."""
    mib = 2**20

    def run(floor: int, available: int | None = None) -> list[int]:
        c = BudgetController(DefaultPolicy(min_headroom_bytes=0, noise_margin_bytes=0), cap_bytes=96 * mib)
        c.floor_bytes = floor
        return [
            c.update(TelemetrySample(t_s=i * 0.5, temp_c=40 + i * 1.5, mem_available_bytes=available))
            for i in range(60)
        ]

    free = run(0)
    assert free[0] == 96 * mib and free[-1] == 48 * mib  # the policy's floor: half the cap at 70 degC and above
    floored = run(75 * mib)
    assert floored[0] == 96 * mib and 75 * mib <= min(floored) and floored[-1] < 80 * mib  # moved, to the floor
    assert run(75 * mib, available=40 * mib)[-1] <= 40 * mib  # memory is hard: below the floor
