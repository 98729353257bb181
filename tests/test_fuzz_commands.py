"""What the command-level fuzzer (benchmarks/bench_fuzz_commands.py) found, one test each, and a
short run of the fuzzer itself: every hostile input ends in one error line and a non-zero exit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memwarden.analyze.diagnose import PATTERNS
from memwarden.cli import main

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_fuzz  # noqa: E402
import bench_fuzz_commands  # noqa: E402


@pytest.fixture
def seed_trace(tmp_path: Path) -> Path:
    path = tmp_path / "seed.mwtrace"
    path.write_bytes(bench_fuzz.seed_trace())
    return path


def one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI in-process; it must exit non-zero with exactly one line on stderr (no traceback)."""
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own errors
        status = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert status not in (0, None), err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# -- diagnose --config: every threshold's name, type and range checked before anything runs ------

BAD_THRESHOLDS = {
    "a word for a number": '[thresholds.all]\nmin_waste_fraction = "lots"\n',
    "nan": "[thresholds.all]\nmin_waste_fraction = nan\n",
    "inf for a count": "[thresholds.kv-reprefill]\nmin_prefix_tokens = inf\n",
    "a boolean": "[thresholds.fragmentation]\nmin_unused_bytes = true\n",
    "a list": "[thresholds.load-spike]\nmin_ratio = [1, 2]\n",
    "a fraction above 1": "[thresholds.graph-retention]\nretained_fraction = 7.5\n",
    "negative bytes": "[thresholds.dequant-temporaries]\nmin_weight_bytes = -1\n",
    "10^30 bins": "[thresholds.unbounded-growth]\nbins = 1000000000000000000000000000000\n",
    "a fractional count": "[thresholds.unbounded-growth]\nmin_bins = 2.5\n",
    "an unknown name": "[thresholds.fragmentation]\nmin_overhead = 0.2\n",
    "an unknown top-level key": "threshold = 3\n[thresholds.all]\nmin_waste_fraction = 0.1\n",
}


@pytest.mark.parametrize("case", sorted(BAD_THRESHOLDS))
def test_diagnose_config_is_validated(case: str, seed_trace: Path, tmp_path: Path, capsys) -> None:
    config = tmp_path / "t.toml"
    config.write_text(BAD_THRESHOLDS[case])
    line = one_error_line(["diagnose", "--json", "--config", str(config), str(seed_trace)], capsys)
    assert line.startswith("memwarden diagnose: error: --config ")


def test_diagnose_config_refuses_a_fifo_before_opening_it(seed_trace: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "t.toml"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer for ever
    # a subprocess, so the old code (which blocked in open()) fails the test instead of hanging it
    proc = subprocess.run([sys.executable, "-m", "memwarden.cli", "diagnose", "--config", str(fifo), str(seed_trace)],
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "not a regular file" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_good_thresholds_apply_as_plain_numbers(seed_trace: Path, tmp_path: Path, capsys) -> None:
    from memwarden.analyze.diagnose import load_thresholds

    config = tmp_path / "t.toml"
    config.write_text("[thresholds.all]\nmin_waste_fraction = 1\n[thresholds.unbounded-growth]\nbins = 4.0\n")
    table = load_thresholds(config)
    assert table == {"all": {"min_waste_fraction": 1.0}, "unbounded-growth": {"bins": 4}}
    assert type(table["unbounded-growth"]["bins"]) is int and type(table["all"]["min_waste_fraction"]) is float
    assert main(["diagnose", "--json", "--config", str(config), str(seed_trace)]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []


def test_every_threshold_a_detector_reads_has_a_rule() -> None:
    """The schema and the detectors' ``ctx.threshold(PATTERN, name, ...)`` calls name the same things."""
    from memwarden.analyze.thresholds import THRESHOLDS

    read: dict[str, set[str]] = {}
    for pattern, module in PATTERNS.items():
        source = (ROOT / "src/memwarden/analyze/patterns" / f"{module}.py").read_text()
        read[pattern] = set(re.findall(r'ctx\.threshold\(\s*PATTERN,\s*"(\w+)"', source))
    read["all"] = {"min_waste_fraction"}
    assert {p: set(rules) for p, rules in THRESHOLDS.items() if rules or read.get(p)} == {
        p: names for p, names in read.items() if names
    }


# -- trace-reading commands: a FIFO or a device is refused, not opened --------------------------


def test_a_fifo_given_as_a_trace_is_refused_without_blocking(seed_trace: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "trace.mwtrace"
    os.mkfifo(fifo)
    for argv in (["summary", str(fifo)], ["compare", str(fifo), str(seed_trace)], ["export", "--format", "chrome",
                 "-o", str(tmp_path / "c.json"), str(fifo)]):  # fmt: skip
        # a subprocess, so the old code (which blocked in open()) fails the test instead of hanging it
        proc = subprocess.run([sys.executable, "-m", "memwarden.cli", *argv], capture_output=True, text=True,
                              timeout=240)  # fmt: skip
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "not a regular file" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_null_annotations_are_refused_at_load(tmp_path: Path, capsys) -> None:
    """``"annotations": null`` loaded, then the report (which takes a missing key as ``[]``) crashed."""
    from memwarden.trace.format import dumps, loads

    trace = loads(bench_fuzz.seed_trace())
    trace.metadata["annotations"] = None
    path = tmp_path / "null.mwtrace"
    path.write_bytes(dumps(trace))
    for argv in (["report", "-o", str(tmp_path / "r.html")], ["summary"], ["diagnose", "--json"]):
        assert "metadata.annotations must be a list" in one_error_line([*argv, str(path)], capsys)


def test_heatmap_of_a_device_without_allocations(seed_trace: Path, tmp_path: Path, capsys) -> None:
    for allocator in ("pytorch", "arena"):
        argv = ["replay", "--allocator", allocator, "--heatmap", str(tmp_path / "h.png"), "--device", "cpu"]
        assert "nothing to draw" in one_error_line([*argv, str(seed_trace)], capsys)
    assert not (tmp_path / "h.png").exists()


# -- align-check: numbers past any real stream ---------------------------------------------------


@pytest.mark.parametrize("where", ["flag", "header"])
def test_align_check_refuses_an_absurd_samples_per_frame(where: str, tmp_path: Path, capsys) -> None:
    """10^80 samples per frame passed as "positive" and the aligner asked numpy for that many."""
    header = [{"type": "header", "audio_per_frame": 10**80}] if where == "header" else []
    records = header + [{"type": t, "t_s": i * 0.04, **({"samples": 640} if t == "audio" else {})}
                        for i in range(10) for t in ("audio", "video")]  # fmt: skip
    log = tmp_path / "a.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    argv = ["align-check", str(log), *(["--audio-per-frame", "9" * 80] if where == "flag" else [])]
    assert "audio_per_frame must be a positive number up to" in one_error_line(argv, capsys)


@pytest.mark.parametrize("url", ["expandable_segments:maybe", "127.0.0.1:99999"])
def test_top_refuses_a_port_that_is_not_one(url: str, capsys) -> None:
    """http.client's InvalidURL (not an OSError or ValueError) escaped ``fetch``."""
    assert "expected http://HOST:PORT/metrics" in one_error_line(["top", url, "--once"], capsys)


# -- estimate and sweep: a config transformers cannot build, numbers that are not finite ---------


@pytest.fixture
def unbuildable_config(tmp_path: Path) -> Path:
    """A qwen2-audio config whose audio encoder has 3 heads for 32 dims: it passes memwarden's
    checks and transformers refuses it while building the model."""
    from memwarden.models import zoo

    doc = json.loads(json.dumps(zoo.build_config("qwen2-audio", "tiny").to_dict(), default=str))
    doc["audio_config"]["encoder_attention_heads"] = 3
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    return path


def test_estimate_of_an_unbuildable_config(unbuildable_config: Path, capsys) -> None:
    argv = ["estimate", str(unbuildable_config), "--no-suggest", "--quiet", "--prompt-tokens", "8", "--new-tokens", "2"]
    line = one_error_line(argv, capsys)
    assert "cannot be built or run by transformers" in line and "embed_dim must be divisible" in line


def test_estimate_sweep_with_infinite_audio(capsys) -> None:
    argv = ["estimate", "qwen2-audio", "--sweep", "--audio-seconds", "inf,1", "--no-suggest", "--quiet"]
    assert "--audio-seconds takes a finite number" in one_error_line(argv, capsys)


def test_sweep_grid_with_infinite_audio(tmp_path: Path, capsys) -> None:
    grid = tmp_path / "g.toml"
    grid.write_text('models = ["qwen2-audio"]\n[[requests]]\naudio_seconds = inf\n')
    assert "requests[0].audio_seconds: must be a finite number" in one_error_line(["sweep", str(grid)], capsys)


def test_sweep_point_whose_config_cannot_be_built(unbuildable_config: Path, tmp_path: Path, capsys) -> None:
    grid = tmp_path / "g.toml"
    grid.write_text(f'models = ["{unbuildable_config}"]\n[[requests]]\nprompt_tokens = 8\nnew_tokens = 2\n')
    line = one_error_line(["sweep", str(grid), "--jobs", "1", "--quiet"], capsys)
    assert "request '8 prompt, 2 new'" in line and "cannot be built or run by transformers" in line


# -- the fuzzer, briefly ---------------------------------------------------------------------------


def test_short_command_fuzz_run(tmp_path: Path, capsys) -> None:
    """A few cases of the kinds that need no model build; the full run (10,000 of each kind,
    estimate and CLI arguments included) is in docs/benchmarks.md."""
    out = tmp_path / "fuzz.json"
    argv = ["--n", "12", "--kinds", "thresholds,trace,snapshot", "--seed", "7", "--keep", str(tmp_path / "k"),
            "--out", str(out), "--json"]  # fmt: skip
    status = bench_fuzz_commands.main(argv)
    results = json.loads(out.read_text())["results"]
    assert [r["kind"] for r in results] == ["thresholds", "trace", "snapshot"]
    for r in results:
        assert r["cases"] == 12 and r["runs"] >= 12
        bad = {k: r[k] for k in ("tracebacks", "executions", "over_time", "over_memory", "crashes", "bad_json")}
        assert not any(bad.values()), (r["kind"], bad, r["findings"])
    assert status == 0
