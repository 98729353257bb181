"""Campaigns: counts add up, statistics match known values, reproducible with a seed."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from memwarden.errors import InputError
from memwarden.resilience.abtest import bootstrap_ci, bootstrap_diff_ci, fisher_exact
from memwarden.resilience.campaign import STATUSES, run_campaign
from memwarden.resilience.config import load_config, parse_config

# A workload whose outcome depends only on the request index: deterministic failures.
FLAKY = """
import os
i = int(os.environ["MEMWARDEN_REQUEST_INDEX"])
if i % 3 == 1:
    hog = [bytearray(1 << 20) for _ in range(384)]  # past a 256 MiB limit: MemoryError; fits 4 GiB
if i % 5 == 4:
    raise ValueError("a bug")
"""


def write_script_config(tmp_path, name: str = "flaky", limit: str = "256MiB", **run: object):
    (tmp_path / "flaky.py").write_text(textwrap.dedent(FLAKY))
    extra = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in run.items())
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\n[workload]\nscript = "flaky.py"\n[limits]\naddress_space = "{limit}"\n'
        f"request_timeout_s = 60\n[run]\n{extra}"
    )
    return load_config(path)


@pytest.mark.parametrize(
    ("table", "p"),
    [
        ((3, 1, 1, 3), 0.4857142857142857),  # Fisher's tea tasting (R: fisher.test)
        ((1, 9, 11, 3), 0.002759456185220088),  # R documentation's job-satisfaction style example
        ((8, 2, 1, 5), 0.03496503496503495),  # scipy.stats.fisher_exact docs
        ((0, 10, 0, 10), 1.0),
        ((10, 0, 0, 10), 1.0825088224469026e-05),
    ],
)
def test_fisher_exact_known_values(table, p) -> None:
    assert fisher_exact(*table) == pytest.approx(p, rel=1e-9)
    a, b, c, d = table
    assert fisher_exact(c, d, a, b) == pytest.approx(p, rel=1e-12)  # rows swapped: same test


def test_fisher_exact_matches_a_brute_force_reference() -> None:
    from fractions import Fraction
    from math import comb

    def reference(a: int, b: int, c: int, d: int) -> float:
        # every table with the same margins, probabilities as exact fractions
        r1, c1, n = a + b, a + c, a + b + c + d
        pmf = {
            k: Fraction(comb(c1, k) * comb(n - c1, r1 - k), comb(n, r1))
            for k in range(max(0, r1 + c1 - n), min(r1, c1) + 1)
        }
        return float(sum(p for p in pmf.values() if p <= pmf[a]))

    for table in [(2, 7, 8, 2), (0, 5, 5, 0), (12, 30, 4, 40), (1, 0, 0, 1), (25, 25, 30, 20), (0, 0, 3, 4)]:
        assert fisher_exact(*table) == pytest.approx(reference(*table), rel=1e-12)


def test_fisher_rejects_bad_tables() -> None:
    with pytest.raises(ValueError):
        fisher_exact(-1, 2, 3, 4)
    with pytest.raises(ValueError):
        fisher_exact(1.5, 2, 3, 4)  # type: ignore[arg-type]


def test_bootstrap_reproducible_with_seed() -> None:
    values = [float(v) for v in np.random.default_rng(0).lognormal(0.0, 0.5, 40)]
    a = bootstrap_ci(values, seed=7)
    assert a == bootstrap_ci(values, seed=7)
    assert len({bootstrap_ci(values, seed=s) for s in range(6)}) > 1  # the seed is what drives it
    assert a.low <= a.estimate <= a.high
    d = bootstrap_diff_ci(values, [v + 1.0 for v in values], seed=3)
    assert d == bootstrap_diff_ci(values, [v + 1.0 for v in values], seed=3)
    assert d.low > 0.3 and d.estimate == pytest.approx(1.0)
    assert bootstrap_ci([], seed=0) is None


def test_script_campaign_counts_add_up(tmp_path, capfd) -> None:
    a = write_script_config(tmp_path, "a")
    b = write_script_config(tmp_path, "b", limit="4GiB")  # the hog fits: no oom on this side
    result = run_campaign(a, b, runs=10, seed=1, progress=True)
    # progress comes from the shard's own process, on stderr, every 10 requests and at the end
    err = capfd.readouterr().err
    assert "stress: A (a): 10/10 requests (ok 6, oom 3, crash 1, lost 0)" in err
    assert "stress: B (b): 10/10 requests (ok 8, oom 0, crash 2, lost 0)" in err
    data = result.to_json(records=True)
    for side in ("a", "b"):
        s = data[side]
        assert s["requests"] == 10 == sum(s[k] for k in STATUSES)
        assert [r["index"] for r in data["records"][side]] == list(range(10))
    # i % 3 == 1 -> oom under 256 MiB; i % 5 == 4 (and not oom first) -> crash
    assert [r["status"] for r in data["records"]["a"]] == [
        "ok",
        "oom",
        "ok",
        "ok",
        "oom",
        "ok",
        "ok",
        "oom",
        "ok",
        "crash",
    ]
    assert (data["b"]["oom"], data["b"]["crash"]) == (0, 2)
    assert data["a"]["recoveries"] == 3 and data["a"]["recovery_p50_s"] > 0
    assert data["failure_rate_p_value"] == pytest.approx(fisher_exact(4, 6, 2, 8))


def test_plain_serving_campaign_with_a_tiny_model(tmp_path) -> None:
    cfg = tmp_path / "plain.toml"
    cfg.write_text(
        '[workload]\nscenario = "demo-chat"\nsize = "tiny"\nturns = 2\nnew_tokens = 3\n'
        '[serving]\nmode = "plain"\n[limits]\naddress_space = "4GiB"\n'
    )
    config = load_config(cfg)
    result = run_campaign(config, config, runs=3, seed=5, inject=["telemetry:period=50ms,temp=40..60"])
    data = result.to_json(records=True)
    for side in ("a", "b"):
        assert data[side]["requests"] == 3 == data[side]["ok"]
        assert data[side]["p50_latency_s"] > 0 and data[side]["peak_rss_max_bytes"] > 50 << 20
    # same request seeds, same greedy answers
    assert data["outputs_compared"] == 3 == data["outputs_equal"]
    assert data["records"]["a"][-1]["injected"]["telemetry_samples"] >= 1


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[workload]\n", "exactly one of scenario"),
        ('[workload]\nscenario = "nope"\n', "unknown 'nope'"),
        ('[workload]\nscenario = "demo-chat"\nturns = "4"\n', "workload.turns"),
        ('[workload]\nscenario = "demo-chat"\n[limits]\naddress_space = "lots"\n', "limits.address_space"),
        ('[workload]\nscenario = "demo-chat"\n[run]\ninject = ["jitter:size=1"]\n', "bad --inject spec"),
        ('[workload]\nscenario = "demo-chat"\n[run]\nworkers = 0\n', "run.workers"),
        ('[workload]\nscenario = "demo-chat"\nbogus = 1\n', "unknown key"),
        ("not toml [", "not valid TOML"),
        ("[workload]\nscript = 'missing.py'\n", "no such script"),
    ],
)
def test_bad_configs(text: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        parse_config(text.encode(), label="c.toml")


def test_shipped_fp32_arms_under_the_largest_jitter() -> None:
    """examples/stress/plain.toml and governed-fp32.toml, as shipped (the same fp32 weights, the watchdog
    derived from a device profile), at the sweep's largest jitter (another app touching every page of
    256 MiB): plain generate() is killed by the watchdog; the session, its budget fitted to what the
    watchdog leaves, streams the weights that do not fit and answers every request (real worker
    processes, the real limits of the files)."""
    from pathlib import Path

    from memwarden.resilience.campaign import plan_shards, run_shard, summarize

    stress = Path(__file__).resolve().parents[1] / "examples" / "stress"
    jitter = ["jitter:size=256MiB,period=15ms"]
    governed = load_config(stress / "governed-fp32.toml")
    (shard,) = plan_shards(governed, side="b", runs=1, seed=3, inject=jitter)
    records = run_shard(shard)
    summary = summarize(records)
    assert (summary["ok"], summary["worker_restarts"]) == (1, 0), [(r["error"], r["latency_s"]) for r in records]
    fit = records[0]["injected"]["fit"]
    assert fit["pressure_bytes"] == 256 * 2**20 and fit["limit_bytes"] == governed.limits.rss_bytes
    assert fit["budget_bytes"] == fit["limit_bytes"] - fit["other_bytes"] - fit["pressure_bytes"] - fit["margin_bytes"]
    stats = records[-1]["server_stats"]
    assert stats["budget_bytes"] == fit["budget_bytes"] and stats["weights_bytes"] < fit["budget_bytes"]
    assert all(r["injected"]["jitter_touched_bytes"] >= 256 * 2**20 for r in records)
    plain = load_config(stress / "plain.toml")
    assert plain.limits == governed.limits
    (shard,) = plan_shards(plain, side="a", runs=1, seed=3, inject=jitter)
    (record,) = run_shard(shard)
    assert record["status"] == "oom" and "watchdog" in record["error"], record


def test_a_sweep_keeps_every_requests_record_when_asked(tmp_path) -> None:
    # `stress --sweep ... --json --records` printed no records: the flag was dropped on the sweep's path.
    from memwarden.resilience.sweep import parse_sweep, run_sweep

    a = write_script_config(tmp_path, "a")
    b = write_script_config(tmp_path, "b", limit="4GiB")
    sweep = parse_sweep("limits:rss=8GiB..6GiB:2")  # far above the script's use: the outcomes are the script's
    data = run_sweep(a, b, sweep, runs=5, inject=[], seed=1, records=True)
    for point in data["points"]:
        for side in ("a", "b"):
            records = point["records"][side]
            assert [r["index"] for r in records] == list(range(5))
            assert sum(r["status"] != "ok" for r in records) == point[side]["failed"]
        assert [r["status"] for r in point["records"]["a"]] == ["ok", "oom", "ok", "ok", "oom"]
    assert "records" not in run_sweep(a, b, sweep, runs=1, inject=[], seed=1)["points"][0]
