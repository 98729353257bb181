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

from memwarden.analyze.patterns import DETECTORS
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
    proc = subprocess.run(
        [sys.executable, "-m", "memwarden.cli", "diagnose", "--config", str(fifo), str(seed_trace)],
        capture_output=True,
        text=True,
        timeout=240,
    )
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

    read: dict[str, set[str]] = {p: set() for p in DETECTORS}
    # every module of the patterns package reads its own PATTERN's thresholds (a detector's parts
    # too: weight_upcast is dequant-temporaries')
    for path in sorted((ROOT / "src/memwarden/analyze/patterns").glob("*.py")):
        source = path.read_text()
        named = re.search(r'^PATTERN = "([\w-]+)"', source, re.M)
        if named is not None and named.group(1) in read:
            read[named.group(1)] |= set(re.findall(r'ctx\.threshold\(\s*PATTERN,\s*"(\w+)"', source))
    diagnose_source = (ROOT / "src/memwarden/analyze/diagnose.py").read_text()
    read["all"] = set(re.findall(r'ctx\.threshold\(\s*"all",\s*"(\w+)"', diagnose_source))
    assert read["all"] == {"min_waste_fraction", "min_work_peaks"}
    assert {p: set(rules) for p, rules in THRESHOLDS.items() if rules or read.get(p)} == {
        p: names for p, names in read.items() if names
    }


# -- trace-reading commands: a FIFO or a device is refused, not opened --------------------------


def test_a_fifo_given_as_a_trace_is_refused_without_blocking(seed_trace: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "trace.mwtrace"
    os.mkfifo(fifo)
    for argv in (
        ["summary", str(fifo)],
        ["compare", str(fifo), str(seed_trace)],
        ["export", "--format", "chrome", "-o", str(tmp_path / "c.json"), str(fifo)],
    ):
        # a subprocess, so the old code (which blocked in open()) fails the test instead of hanging it
        proc = subprocess.run(
            [sys.executable, "-m", "memwarden.cli", *argv], capture_output=True, text=True, timeout=240
        )
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


def test_step_numbers_past_int64_are_dropped_at_parse(tmp_path: Path, capsys) -> None:
    """A step's ``input_ids`` holding -1e308 (the fuzzer's case) or 2^70 reached numpy's int64 in the
    kv-reprefill detector: OverflowError out of ``diagnose``. Step fields past int64 are dropped."""
    from memwarden.trace.format import dumps, loads

    trace = loads(bench_fuzz.seed_trace())
    ids = [1, 707, 822, *([1023] * 12), -1e308, 2**70, 5]
    trace.metadata["steps"] = [
        {
            "phase": "prefill",
            "start_us": 10 + 100 * i,
            "end_us": 90 + 100 * i,
            "seq_len": len(ids),
            "input_ids": ids,
            "tokens": {"text": 2**80},
            "batch": 1,
        }
        for i in range(2)
    ] + [{"phase": "decode", "start_us": 2**70, "end_us": 2**71}]
    path = tmp_path / "steps.mwtrace"
    path.write_bytes(dumps(trace))
    assert main(["diagnose", "--json", str(path)]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert "findings" in json.loads(out.out)


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
    records = header + [
        {"type": t, "t_s": i * 0.04, **({"samples": 640} if t == "audio" else {})}
        for i in range(10)
        for t in ("audio", "video")
    ]
    log = tmp_path / "a.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    argv = ["align-check", str(log), *(["--audio-per-frame", "9" * 80] if where == "flag" else [])]
    assert "audio_per_frame must be a number from 1 to" in one_error_line(argv, capsys)


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


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["estimate", "qwen2-vl-2b-instruct", "--batch", "1" + "0" * 400], "--batch 1000"),
        (["trace", "--ring", "1e999", "SCRIPT"], "--ring inf: give the window in seconds"),
        (["trace", "--ring", "nan", "SCRIPT"], "--ring nan: give the window in seconds"),
        (["telemetry", "--json", "--count", "9" * 400], "--count 99999999999999999999...: too large"),
    ],
)
def test_numbers_past_any_real_request_are_one_error(argv: list[str], expected: str, tmp_path: Path, capsys) -> None:
    """Found by the CLI fuzzer: a TypeError deep in torch.randint and an OverflowError in the ring
    supervisor; now refused where the flag is read."""
    script = tmp_path / "script.py"
    script.write_text("print('ran')\n")
    argv = [str(script) if a == "SCRIPT" else a for a in argv]
    assert expected in one_error_line(argv, capsys)


def test_sweep_grid_with_infinite_audio(tmp_path: Path, capsys) -> None:
    grid = tmp_path / "g.toml"
    grid.write_text('models = ["qwen2-audio"]\n[[requests]]\naudio_seconds = inf\n')
    assert "requests[0].audio_seconds: must be a finite number" in one_error_line(["sweep", str(grid)], capsys)


def test_sweep_point_whose_config_cannot_be_built(unbuildable_config: Path, tmp_path: Path, capsys) -> None:
    grid = tmp_path / "g.toml"
    grid.write_text(f'models = ["{unbuildable_config}"]\n[[requests]]\nprompt_tokens = 8\nnew_tokens = 2\n')
    line = one_error_line(["sweep", str(grid), "--jobs", "1", "--quiet"], capsys)
    assert "request '8 prompt, 2 new'" in line and "cannot be built or run by transformers" in line


# -- sizes beyond any device: refused where the file is read, not three commands later ---------


def _snapshot_with(tmp_path: Path, **fields: int) -> Path:
    """The fuzzer's seed snapshot with ``fields`` set on one of its allocations."""
    import pickle

    from memwarden.interop.snapshot import _restricted_loads

    snap = _restricted_loads(bench_fuzz.seed_snapshot())
    entry = next(e for entries in snap["device_traces"] for e in entries if e["action"] == "alloc")
    entry.update(fields)
    path = tmp_path / "huge.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return path


@pytest.mark.parametrize("field", ["size", "time_us"])
def test_snapshot_sizes_beyond_any_device_are_refused_at_import(field: str, tmp_path: Path, capsys) -> None:
    """A 2**62-byte malloc loaded, then the allocator model (diagnose, replay) and the arena (plan)
    raised ValueError: the importer now holds sizes and times to what a .mwtrace may hold."""
    path = _snapshot_with(tmp_path, **{field: 2**62})
    for argv in (["diagnose"], ["plan"], ["replay"], ["replay", "--allocator", "arena"], ["summary", "--json"]):
        line = one_error_line([*argv, str(path)], capsys)
        assert f"'{field}' is out of range (4611686018427387904; expected 0.." in line, line


def test_a_device_past_256_tib_is_one_error_in_the_planners(tmp_path: Path, capsys) -> None:
    """Sizes each within a trace's limits (2**48) that the allocator model (48-bit sizes) or the arena
    (48-bit offsets) cannot hold: one error line, not a ValueError traceback."""
    from memwarden.trace.format import dumps, loads
    from memwarden.trace.model import Trace

    trace = loads(bench_fuzz.seed_trace())
    nbytes = trace.events["nbytes"].copy()
    nbytes[nbytes > 0] = 2**48  # the largest one event may declare
    big = Trace(
        events={**trace.events, "nbytes": nbytes},
        spans=trace.spans,
        strings=trace.strings,
        shapes=trace.shapes,
        devices=trace.devices,
        metadata=trace.metadata,
    )
    path = tmp_path / "big.mwtrace"
    path.write_bytes(dumps(big))
    assert "more than 256 TiB" in one_error_line(["plan", str(path)], capsys)
    assert "more than 256 TiB" in one_error_line(["replay", "--allocator", "arena", str(path)], capsys)
    assert "cannot model a malloc of 281474976710656 bytes" in one_error_line(["replay", str(path)], capsys)


# -- config.json: dimensions no real model has, named, before any model is built -----------------


def _zoo_config(tmp_path: Path, name: str, **vision: int) -> Path:
    from memwarden.models import zoo

    doc = json.loads(json.dumps(zoo.build_config(name, "tiny").to_dict(), default=str))
    doc["vision_config"].update(vision)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    ("name", "vision", "field"),
    [
        ("qwen2-vl", {"depth": 2**64}, "vision_config.depth"),  # ran past 60 s
        ("qwen2-vl", {"depth": 32_000}, "vision_config.depth"),  # a plain "x1000" mutation: minutes
        ("llava", {"image_size": 32768, "patch_size": 1024}, "vision_config.image_size"),  # PIL MemoryError
    ],
)
def test_config_dimensions_beyond_any_real_model(
    name: str, vision: dict[str, int], field: str, tmp_path: Path, capsys
) -> None:
    from memwarden.errors import InputError
    from memwarden.estimation.resolve import resolve_model

    path = _zoo_config(tmp_path, name, **vision)
    # resolving first: the old code accepted these and went on to build (for minutes, or out of memory)
    with pytest.raises(InputError, match=re.escape(field)):
        resolve_model(str(path))
    argv = ["estimate", str(path), "--no-suggest", "--image", "64x48", "--prompt-tokens", "8", "--new-tokens", "2"]
    line = one_error_line(argv, capsys)
    assert f"{field} = " in line and ("beyond any real model" in line or "not a size this tool accepts" in line)


def test_real_and_zoo_configs_pass_the_dimension_checks() -> None:
    from memwarden.estimation.resolve import CONFIG_DIR, _check_sizes
    from memwarden.models import zoo

    for config in sorted(CONFIG_DIR.glob("*.json")):
        _check_sizes(json.loads(config.read_text()), config)
    for name in zoo.NAMES:
        _check_sizes(json.loads(json.dumps(zoo.build_config(name, "tiny").to_dict(), default=str)), Path(name))


# -- top: a URL http.client refuses ---------------------------------------------------------------


@pytest.mark.parametrize("url", [" ", "127.0.0.1:9\x01", "host name:80", "127.0.0.1:9/me trics\n"])
def test_top_refuses_control_characters_and_spaces_in_the_url(url: str, capsys) -> None:
    """http.client raised InvalidURL (neither OSError nor ValueError) out of ``fetch``."""
    assert "expected http://HOST:PORT/metrics" in one_error_line(["top", url, "--once"], capsys)


# -- lora: a device or FIFO is refused before it is read -----------------------------------------


@pytest.fixture
def adapter(tmp_path: Path) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    path = tmp_path / "adapter.safetensors"
    save_file(
        {
            "base_model.model.layers.0.q_proj.lora_A.weight": np.ones((2, 8), np.float32),
            "base_model.model.layers.0.q_proj.lora_B.weight": np.zeros((8, 2), np.float32),
        },
        str(path),
    )
    return path


@pytest.mark.parametrize("command", ["diff", "apply", "manifest"])
def test_lora_refuses_a_device_before_reading_it(command: str, adapter: Path, tmp_path: Path) -> None:
    """``lora diff OLD /dev/zero`` read the device until MemoryError. A subprocess under a 3 GiB
    address-space limit, so the old code fails the test instead of taking the machine's memory."""
    argv = {
        "diff": ["diff", str(adapter), "/dev/zero", "-o", str(tmp_path / "d.st")],
        "apply": ["apply", str(adapter), "/dev/zero", "-o", str(tmp_path / "n.st")],
        "manifest": ["manifest", "/dev/zero"],
    }[command]
    code = "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
    code += "from memwarden.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, "lora", *argv], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "/dev/zero: not a regular file" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# -- the fuzzer, briefly ---------------------------------------------------------------------------


def test_short_command_fuzz_run(tmp_path: Path, capsys) -> None:
    """A few cases of the kinds that need no model build; the full run (10,000 of each kind,
    estimate and CLI arguments included) is in docs/benchmarks.md."""
    out = tmp_path / "fuzz.json"
    argv = [
        "--n",
        "12",
        "--kinds",
        "thresholds,trace,snapshot",
        "--seed",
        "7",
        "--keep",
        str(tmp_path / "k"),
        "--out",
        str(out),
        "--json",
    ]
    status = bench_fuzz_commands.main(argv)
    results = json.loads(out.read_text())["results"]
    assert [r["kind"] for r in results] == ["thresholds", "trace", "snapshot"]
    for r in results:
        assert r["cases"] == 12 and r["runs"] >= 12
        bad = {k: r[k] for k in ("tracebacks", "executions", "over_time", "over_memory", "crashes", "bad_json")}
        assert not any(bad.values()), (r["kind"], bad, r["findings"])
    assert status == 0
