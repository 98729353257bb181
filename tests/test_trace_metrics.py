"""``memwarden trace --metrics-port``: any traced script's memory as Prometheus metrics, scraped
over 127.0.0.1 while it runs and parsed with prometheus_client's parser. The script holds a
tensor and waits for the test, so what a scrape says can be compared with the stream at the
same moment; nothing depends on how fast the machine is."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from memwarden.commands._trace_metrics import stream_figures
from memwarden.trace.io import load

SCRIPT = """
import os, sys, time, torch
go = sys.argv[1]
pixel_values = torch.zeros(2 * 1024 * 1024)  # 8 MiB, held while the test scrapes
open(go + ".ready", "w").close()
while not os.path.exists(go):
    time.sleep(0.05)
"""
HELD = 8 * 1024 * 1024


def _scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(url, timeout=60) as response:
        text = response.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _wait_for(what, proc: subprocess.Popen[str], deadline_s: float = 900.0):
    """Poll until ``what()`` is truthy while the run goes on (the deadline only guards a hang)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        assert proc.poll() is None, f"the traced run ended first: {proc.stderr.read()}"  # type: ignore[union-attr]
        time.sleep(0.1)
    raise AssertionError(f"not reached in {deadline_s:.0f} s: {what}")


def test_a_running_script_is_scraped_and_equals_its_stream(tmp_path: Path) -> None:
    script = tmp_path / "hold.py"
    script.write_text(SCRIPT)
    go, out = tmp_path / "go", tmp_path / "run.mwtrace"
    proc = subprocess.Popen(
        [sys.executable, "-m", "memwarden.cli", "trace", "-o", str(out), "--metrics-port", "0", str(script), str(go)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stderr.readline()  # type: ignore[union-attr]
        assert first.startswith("memwarden: serving metrics on http://127.0.0.1:"), first
        url = first.split()[-1]
        _wait_for(lambda: (tmp_path / "go.ready").exists(), proc)
        scraped = _wait_for(
            lambda: (m := _scrape(url)).get("memwarden_trace_live_total_bytes", {}).get((), 0) >= HELD and m,
            proc,
        )
        assert scraped["memwarden_trace_running"][()] == 1
        by_category = {dict(k)["category"]: v for k, v in scraped["memwarden_trace_live_bytes"].items()}
        by_modality = {dict(k)["modality"]: v for k, v in scraped["memwarden_trace_live_modality_bytes"].items()}
        live = scraped["memwarden_trace_live_total_bytes"][()]
        assert sum(by_category.values()) == sum(by_modality.values()) == live
        assert scraped["memwarden_trace_peak_bytes"][()] >= live >= HELD
        assert sum(scraped["memwarden_trace_phase"].values()) == 1
        # The script waits, so the stream stays as the scrape read it: the same figures.
        figures = stream_figures(out)
        assert figures is not None
        assert figures["category"] == by_category and figures["modality"] == by_modality
        assert figures["live"] == live and figures["peak"] == scraped["memwarden_trace_peak_bytes"][()]
        assert figures["events"] == scraped["memwarden_trace_events_total"][()]
        go.touch()
        assert proc.wait(timeout=300) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert load(out).metadata["exit_status"] == 0
    with pytest.raises(OSError):  # the exporter stopped with the run
        urllib.request.urlopen(url, timeout=10)


def test_bad_ports_are_one_clear_error(tmp_path: Path, cli) -> None:
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    done = cli("trace", "-o", str(tmp_path / "a.mwtrace"), "--metrics-port", "70000", str(script))
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "--metrics-port 70000: give a TCP port" in done.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli("trace", "-o", str(tmp_path / "b.mwtrace"), "--metrics-port", str(port), str(script))
    assert done.returncode == 2 and f"cannot serve on 127.0.0.1:{port}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "a.mwtrace").exists() and not (tmp_path / "b.mwtrace").exists()
