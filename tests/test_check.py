"""`memwarden check`: limits by phase, modality, category and allocated bytes, and growth against a
baseline, on traces of real zoo runs (a processor change that raises the image tokens) and on a
hand-built trace whose figures are known exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memwarden.analyze.analysis import Analysis
from memwarden.analyze.baseline import compare_at_peak, compare_traces, figures, figures_at_peak, growth_breaches
from memwarden.analyze.check import Limit, check_limits, measure, parse_limit, parse_scope
from memwarden.cli import main
from memwarden.trace.io import save
from memwarden.trace.model import Action, Category, Modality, Phase, Trace, TraceBuilder

KiB = 1024


def _hand_trace() -> Trace:
    """load: 100 KiB text weight; encode: 30 KiB vision activation (freed at 4); prefill: 50 KiB
    vision activation + 20 KiB text kv (kv kept), the 50 KiB freed at 7; decode: 10 KiB text temp."""
    b = TraceBuilder()
    b.event(0, Action.PREEXISTING, 1, 0, 100 * KiB, category=Category.WEIGHT, modality=Modality.TEXT, phase=Phase.LOAD)
    b.event(
        1,
        Action.ALLOC,
        2,
        0,
        30 * KiB,
        category=Category.ACTIVATION,
        modality=Modality.VISION,
        phase=Phase.ENCODE,
        line="app.py:3:enc",
    )
    b.event(
        2,
        Action.ALLOC,
        3,
        0,
        50 * KiB,
        category=Category.ACTIVATION,
        modality=Modality.VISION,
        phase=Phase.PREFILL,
        line="app.py:7:pre",
    )
    b.event(
        3,
        Action.ALLOC,
        4,
        0,
        20 * KiB,
        category=Category.KV_CACHE,
        modality=Modality.TEXT,
        phase=Phase.PREFILL,
        line="app.py:8:pre",
    )
    b.event(
        4,
        Action.FREE,
        2,
        0,
        30 * KiB,
        category=Category.ACTIVATION,
        modality=Modality.VISION,
        phase=Phase.ENCODE,
        line="app.py:3:enc",
    )
    b.event(
        7,
        Action.FREE,
        3,
        0,
        50 * KiB,
        category=Category.ACTIVATION,
        modality=Modality.VISION,
        phase=Phase.PREFILL,
        line="app.py:7:pre",
    )
    b.event(8, Action.ALLOC, 5, 0, 10 * KiB, category=Category.TEMPORARY, modality=Modality.TEXT, phase=Phase.DECODE)
    b.event(9, Action.FREE, 5, 0, 10 * KiB, category=Category.TEMPORARY, modality=Modality.TEXT, phase=Phase.DECODE)
    return b.build()


@pytest.mark.parametrize(
    ("spec", "expected_kib"),
    [
        ("process=1", 200),  # 100 + 30 + 50 + 20 alive at event 3
        ("encode=1", 130),
        ("prefill=1", 200),
        ("decode=1", 130),  # 100 weight + 20 kv + 10 temp
        ("vision=1", 80),
        ("prefill.vision=1", 80),  # the 30 KiB of encode is still alive when prefill allocates
        ("decode.vision=1", 0),
        ("kv_cache=1", 20),
        ("text.weight=1", 100),
        ("allocated:process=1", 110),  # the preexisting weight was not allocated during the run
        ("allocated:prefill=1", 70),
        ("allocated:vision=1", 80),
    ],
)
def test_figures_of_a_hand_built_trace(spec: str, expected_kib: int) -> None:
    assert measure(_hand_trace(), parse_limit(spec)).measured_bytes == expected_kib * KiB


def test_top_lines_at_the_peak_hold_the_scoped_bytes() -> None:
    outcome = measure(_hand_trace(), parse_limit("prefill.vision=1KiB"))
    assert [(x.line, x.nbytes) for x in outcome.top_lines] == [("app.py:7:pre", 50 * KiB), ("app.py:3:enc", 30 * KiB)]
    assert not outcome.ok and outcome.over_bytes == 79 * KiB
    assert "peak prefill.vision 80.0 KiB > limit 1.0 KiB" in outcome.message()


def test_scopes_parse_and_refuse_what_is_not_one() -> None:
    assert parse_scope("prefill.vision") == {"phase": "prefill", "modality": "vision"}
    assert parse_scope("category:other+decode") == {"category": "other", "phase": "decode"}
    assert parse_scope("process") == {}
    for bad in ("other", "prefill.decode", "visoin", "phase:vision"):
        with pytest.raises(ValueError):
            parse_scope(bad)
    for bad in ("prefill", "prefill=lots", "allocated:=1"):
        with pytest.raises(ValueError):
            parse_limit(bad)


# -- real runs: a processor change that raises the image tokens --------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same qwen2-vl request with a 56x56 image (16 image tokens) and a 224x224 one (256
    tokens): what a processor upgrade that stops downscaling images does to a deployment."""
    import torch

    import memwarden
    from memwarden.models import zoo

    model: Any = zoo.build_model("qwen2-vl")
    out = tmp_path_factory.mktemp("check")
    paths = {}
    for name, side in (("small", 56), ("large", 224)):
        inputs = zoo.make_inputs(model, image_size=(side, side))
        with memwarden.capture() as cap, torch.no_grad():
            model.generate(**inputs, **zoo.generate_kwargs("qwen2-vl"), max_new_tokens=3)
        paths[name] = out / f"{name}.mwtrace"
        assert cap.trace is not None
        save(cap.trace, paths[name])
    return paths


def _figures(path: Path) -> dict[str, int]:
    trace = memwarden_load(path)
    return {s: measure(trace, parse_limit(f"{s}=1")).measured_bytes for s in ("process", "encode", "prefill", "vision")}


def memwarden_load(path: Path) -> Trace:
    from memwarden.trace.io import load

    return load(path)


def test_whole_run_figures_agree_with_summary(runs: dict[str, Path]) -> None:
    trace = memwarden_load(runs["small"])
    summary = Analysis(trace).summary
    assert measure(trace, Limit(max_bytes=0)).measured_bytes == summary.peak_bytes
    phases = {p: measure(trace, Limit(max_bytes=0, phase=p)).measured_bytes for p in summary.by_phase_peak}
    # summary also reads the rows where a phase's blocks are freed later, so it may only be higher
    assert all(0 < phases[p] <= peak for p, peak in summary.by_phase_peak.items())
    assert max(phases.values()) == summary.peak_bytes


def test_larger_images_break_phase_and_vision_limits_not_the_total(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    small, large = _figures(runs["small"]), _figures(runs["large"])
    # Limits a team would set from the run it shipped: 5% headroom per phase and for vision,
    # and a process limit with room to spare (the device's budget).
    total_limit = 2 * large["process"]
    args = [f"--max-peak={total_limit}"] + [
        f"--max={s}={int(small[s] * 1.05)}" for s in ("encode", "prefill", "vision")
    ]

    assert main(["check", str(runs["small"]), *args]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: 4 checks hold")

    assert main(["check", str(runs["large"]), *args]) == 1
    captured = capsys.readouterr()
    breaches = captured.out.splitlines()
    assert [line.split()[4] for line in breaches] == ["encode", "prefill", "vision"]  # one line per breach
    assert all(line.startswith("memory limit exceeded: peak ") for line in breaches)
    assert "process" not in captured.out and large["process"] < total_limit
    assert "top lines at the peak:" in captured.err and "test_check.py" in captured.err


def test_growth_against_a_baseline(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(runs["small"]), "--baseline", str(runs["small"]), "--max-growth", "5%"]) == 0
    assert capsys.readouterr().out.startswith("ok: 1 check holds")

    assert main(["check", str(runs["large"]), "--baseline", str(runs["small"]), "--max-growth", "5%"]) == 1
    captured = capsys.readouterr()
    grown = captured.out.splitlines()
    assert "memory grew: phase encode" in captured.out and "memory grew: phase prefill" in captured.out
    assert any(line.startswith("memory grew: module model.visual.") for line in grown)
    assert all(line.startswith("memory grew: ") for line in grown)
    assert "by modality:" in captured.err and "\n  vision " in captured.err and "by line:" in captured.err
    assert max(len(line) for line in captured.err.splitlines()) <= 80

    comparison = compare_traces(memwarden_load(runs["small"]), memwarden_load(runs["large"]))
    vision = next(d for d in comparison.of("modality") if d.key == "vision")
    assert vision.new_bytes == _figures(runs["large"])["vision"] and vision.delta_bytes > 0
    # A tolerance larger than any growth passes the same pair.
    assert growth_breaches(comparison, max_growth=1e6) == []


def test_check_and_compare_share_one_comparison(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    small, large = memwarden_load(runs["small"]), memwarden_load(runs["large"])
    # `memwarden compare` prints the comparison at the peak, row for row.
    assert main(["compare", str(runs["small"]), str(runs["large"]), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    at_peak = compare_at_peak(small, large)
    assert [(r["section"], r["label"], r["a_bytes"], r["b_bytes"]) for r in rows] == [
        (d.kind, d.key, d.old_bytes, d.new_bytes) for d in at_peak.deltas
    ]
    summary = Analysis(large).summary
    totals = {d.key: d.new_bytes for d in at_peak.of("total")}
    assert totals == {
        "peak": summary.peak_bytes,
        "weights": summary.weights_bytes,
        "peak above weights": summary.peak_bytes - summary.weights_bytes,
    }
    assert {d.key: d.new_bytes for d in at_peak.of("phase")} == summary.by_phase_peak
    # Modules heaviest first, by name on ties: the same rows whatever the interpreter's hash seed.
    modules = at_peak.of("module")
    assert 0 < len(modules) <= 15
    assert modules == sorted(modules, key=lambda d: (-max(d.old_bytes, d.new_bytes), d.key))
    # Both views pair each side's own figures the same way: a figure one side lacks is 0 there.
    over_run = compare_traces(small, large)
    for comparison, (a, b) in (
        (at_peak, (figures_at_peak(small), figures_at_peak(large))),
        (over_run, (figures(small), figures(large))),
    ):
        for d in comparison.deltas:
            assert (d.old_bytes, d.new_bytes) == (a.get((d.kind, d.key), 0), b.get((d.kind, d.key), 0))
    keys = set(figures(small)) | set(figures(large))
    assert {(d.kind, d.key) for d in over_run.deltas} == {k for k in keys if over_run.has_lines or k[0] != "line"}


def test_json_and_bad_input(runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["check", str(runs["large"]), "--max", "allocated:vision=1KiB", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["outcomes"][0]["limit"]["measure"] == "allocated"
    assert data["outcomes"][0]["measured_bytes"] > 1024

    garbage = tmp_path / "x.mwtrace"
    garbage.write_bytes(b"not a trace")
    for argv in (
        ["check", str(runs["small"])],  # nothing to check
        ["check", str(runs["small"]), "--max", "prefil=1GiB"],
        ["check", str(runs["small"]), "--max-peak", "lots"],
        ["check", str(runs["small"]), "--max-growth", "5%"],  # no baseline
        ["check", str(garbage), "--max-peak", "1GiB"],
        ["check", str(tmp_path / "missing.mwtrace"), "--max-peak", "1GiB"],
    ):
        assert main(argv) == 2, argv
        assert capsys.readouterr().err.startswith("memwarden check: error: ")


def test_exit_status_of_the_real_command(runs: dict[str, Path], cli) -> None:
    done = cli("check", str(runs["large"]), "--max-peak", "1KiB")
    assert done.returncode == 1
    assert done.stdout.startswith("memory limit exceeded: peak process ")
    assert check_limits(memwarden_load(runs["large"]), [Limit(max_bytes=2**40)]).ok
