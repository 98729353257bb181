"""The command line as a user runs it: real subprocesses, real scripts, real files."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

from conftest import run_cli
from memwarden.trace.io import load
from memwarden.trace.model import Action

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    with torch.no_grad():
        y = model(torch.randn(16, 64))
    print("args", sys.argv[1:], __name__)
    if "--exit" in sys.argv:
        sys.exit(int(sys.argv[-1]))
    if "--raise" in sys.argv:
        raise ValueError("the script failed")
    """
)


def one_clear_line(stderr: str) -> None:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    return path


def test_help_lists_commands() -> None:
    out = run_cli("--help").stdout
    for command in ("trace", "summary", "report", "export", "demo"):
        assert command in out


def test_trace_runs_script_as_main_with_its_args(tmp_path: Path, script: Path) -> None:
    out = tmp_path / "run.mwtrace"
    proc = run_cli("trace", "-o", str(out), str(script), "a", "--flag")
    assert proc.returncode == 0, proc.stderr
    assert "args ['a', '--flag'] __main__" in proc.stdout
    trace = load(out)
    weights = 64 * 256 * 4 + 256 * 4 + 256 * 8 * 4 + 8 * 4
    assert trace.metadata["exit_status"] == 0
    summary = json.loads(run_cli("summary", "--json", str(out)).stdout)
    assert summary["weights_bytes"] == weights
    assert set(summary) >= {
        "peak_bytes",
        "peak_time_us",
        "events",
        "by_category_at_peak",
        "by_modality_at_peak",
        "by_phase_peak",
        "weights_bytes",
        "weights_by_modality",
    }
    assert summary["peak_bytes"] >= weights + 16 * 256 * 4


@pytest.mark.parametrize(("flags", "status"), [(["--exit", "3"], 3), (["--raise"], 1)])
def test_failing_script_keeps_trace_and_status(tmp_path: Path, script: Path, flags: list[str], status: int) -> None:
    out = tmp_path / "fail.mwtrace"
    proc = run_cli("trace", "-o", str(out), str(script), *flags)
    assert proc.returncode == status
    trace = load(out)
    assert trace.metadata["exit_status"] == status
    assert (trace.events["action"] == Action.ALLOC).any()  # the forward pass before the failure is there
    if status == 1:
        assert "ValueError: the script failed" in proc.stderr
        assert "memwarden/commands" not in proc.stderr  # the user's traceback, not ours


def test_trace_missing_script_is_one_line_and_no_output(tmp_path: Path) -> None:
    out = tmp_path / "x.mwtrace"
    proc = run_cli("trace", "-o", str(out), str(tmp_path / "nope.py"))
    assert proc.returncode == 2
    one_clear_line(proc.stderr)
    assert not out.exists()


@pytest.mark.parametrize("content", [b"", b"not a trace at all", b"MWTRACE\0\x01\0\0\0\xff\xff"])
def test_summary_bad_files(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "bad.mwtrace"
    bad.write_bytes(content)
    proc = run_cli("summary", str(bad))
    assert proc.returncode != 0
    one_clear_line(proc.stderr)


def test_summary_truncated_trace(tmp_path: Path, script: Path) -> None:
    out = tmp_path / "run.mwtrace"
    assert run_cli("trace", "-o", str(out), str(script)).returncode == 0
    data = out.read_bytes()
    out.write_bytes(data[: len(data) // 2])
    proc = run_cli("summary", str(out))
    assert proc.returncode == 2
    one_clear_line(proc.stderr)
    assert "truncated" in proc.stderr


def test_summary_missing_and_directory(tmp_path: Path) -> None:
    for arg in (str(tmp_path / "missing.mwtrace"), str(tmp_path)):
        proc = run_cli("summary", arg)
        assert proc.returncode == 2
        one_clear_line(proc.stderr)


def test_unknown_demo_model_lists_names(tmp_path: Path) -> None:
    proc = run_cli("demo", "--model", "gpt-17", "-o", str(tmp_path))
    assert proc.returncode == 2
    one_clear_line(proc.stderr)
    assert "llava" in proc.stderr
    assert not (tmp_path / "report.html").exists()


def test_demo_writes_a_report_that_renders_in_chromium(tmp_path: Path, chromium: str) -> None:
    proc = run_cli("demo", "--size", "tiny", "--turns", "3", "--json", "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["summary"]["peak_bytes"] > result["summary"]["weights_bytes"] > 0
    assert {"encode", "prefill", "decode"} <= set(result["summary"]["by_phase_peak"])
    # the deployment resends the same image every turn: diagnose names it
    assert "kv-reprefill" in [f["pattern"] for f in result["findings"]]
    # ... and the same turns served by a GovernedSession: same tokens, finding gone, under the budget
    governed = result["governed"]
    assert governed["outputs_equal"] is True
    assert governed["findings"] == []
    assert governed["summary"]["peak_bytes"] <= result["budget_bytes"]
    assert all(
        r["reused_tokens"] > 0 and not r["decision"]["action"] == "reject" for r in governed["stats"]["requests"][1:]
    )
    assert (tmp_path / "governed.html").exists() and (tmp_path / "governed.mwtrace").exists()
    thermal = result["thermal"]  # a replayed thermal event halves the session's budget mid-conversation
    assert thermal["failed"] == 0 and thermal["outputs_equal"] is True and thermal["budget_violations"] == 0
    assert thermal["min_budget_bytes"] <= 0.6 * thermal["start_budget_bytes"]
    assert any(d["kind"] == "kv-pool" for d in thermal["decisions"])
    report = tmp_path / "report.html"
    assert report.exists() and (tmp_path / "demo.mwtrace").exists()
    profile = tempfile.mkdtemp(dir=tmp_path)
    dom = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            report.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert re.search(r'<body[^>]*data-rendered="1"', dom), dom[:500]
    series = re.search(r'id="mw-status"[^>]*data-series="(\d+)"', dom) or re.search(
        r'data-series="(\d+)"[^>]*id="mw-status"', dom
    )
    assert series and int(series.group(1)) >= 3
    markers = re.search(r'id="mw-status"[^>]*data-markers="(\d+)"', dom) or re.search(
        r'data-markers="(\d+)"[^>]*id="mw-status"', dom
    )
    assert markers and int(markers.group(1)) == len(result["findings"])  # every finding is marked on the timeline
    assert "Allocator heatmap" in dom and "data:image/png;base64," in dom
