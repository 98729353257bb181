"""memwarden diagnose through the CLI: JSON shape, thresholds file, HTML, bad input."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
import torch

import memwarden
from conftest import run_cli
from memwarden.trace.io import save

SCENARIO = Path(__file__).parent.parent / "examples" / "scenarios" / "kv-reprefill" / "chat_resend_image.py"


@pytest.fixture(scope="module")
def reprefill_trace(tmp_path_factory) -> Path:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with memwarden.capture() as cap:
            runpy.run_path(str(SCENARIO), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    return save(cap.trace, tmp_path_factory.mktemp("diag") / "chat.mwtrace")


def test_json_shape_and_sorting(reprefill_trace: Path) -> None:
    proc = run_cli("diagnose", "--json", str(reprefill_trace))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == {"peak_bytes", "findings"}
    assert data["findings"], "the scenario's pattern must be found"
    for f in data["findings"]:
        assert set(f) == {
            "pattern",
            "severity",
            "bytes_at_peak",
            "wasted_bytes",
            "where",
            "evidence",
            "fix",
            "peak_added_bytes",
            "allocated_bytes",
            "saving_peak_bytes",
            "saving_allocated_bytes",
            "lines",
        }
        assert all(set(x) == {"file", "line", "nbytes"} for x in f["lines"])
        assert f["severity"] in ("high", "medium", "low")
        assert isinstance(f["saving_peak_bytes"], int) and f["saving_peak_bytes"] >= 0
        assert isinstance(f["saving_allocated_bytes"], int) and f["saving_allocated_bytes"] >= 0
    # ranked by the peak the fix saves; those that save only work after them, by that work
    lowers = [f["saving_peak_bytes"] for f in data["findings"] if f["saving_peak_bytes"] > 0]
    assert lowers == sorted(lowers, reverse=True)
    kinds = [f["saving_peak_bytes"] > 0 for f in data["findings"]]
    assert kinds == sorted(kinds, reverse=True)
    assert "kv-reprefill" in [f["pattern"] for f in data["findings"]]


def test_thresholds_file_changes_the_verdict(reprefill_trace: Path, tmp_path: Path) -> None:
    config = tmp_path / "t.toml"
    config.write_text("[thresholds.all]\nmin_waste_fraction = 0.99\nmin_work_peaks = 1000\n")
    data = json.loads(run_cli("diagnose", "--json", "--config", str(config), str(reprefill_trace)).stdout)
    assert data["findings"] == []


def test_html_has_the_findings(reprefill_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "d.html"
    proc = run_cli("diagnose", "--html", str(out), str(reprefill_trace))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert "kv-reprefill" in page and "finding-1" in page


@pytest.mark.parametrize("config_text", ["not toml [[[", "[thresholds.no-such-pattern]\nx = 1\n", "thresholds = 3\n"])
def test_bad_thresholds_file(reprefill_trace: Path, tmp_path: Path, config_text: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(config_text)
    proc = run_cli("diagnose", "--config", str(config), str(reprefill_trace))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_unknown_pattern_and_missing_file(reprefill_trace: Path, tmp_path: Path) -> None:
    for args in (["--pattern", "oom-magic", str(reprefill_trace)], [str(tmp_path / "none.mwtrace")]):
        proc = run_cli("diagnose", *args)
        assert proc.returncode == 2
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
