"""The flight recorder (``memwarden trace --ring SECONDS``, ``capture(ring_s=...)``), issue 25.

A serving loop runs under a short window until the recorder has cut its log many times; what it
held is compared with what it logged, so no assertion depends on the machine's speed (both grow
with it). Failures are injected: a ``MemoryError`` raised by the script, SIGUSR1 sent after a
marker file, a SIGKILL after the window was written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import memwarden
from memwarden.runtime.session_config import SessionConfig
from memwarden.trace.model import Action, Category

MIB = 1 << 20
WEIGHTS = 2048 * 2048 * 4 + 2048 * 4  # the Linear's weight and bias

SERVE = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    import memwarden

    mode, marker, stats_file = sys.argv[1], sys.argv[2], sys.argv[3]
    model = torch.nn.Linear(2048, 2048)  # weights: allocated long before any window
    x = torch.randn(4, 2048)
    allocations = 0
    while True:  # a serving loop: each request allocates and frees
        with torch.no_grad():
            model(x)
        for _ in range(40):
            torch.ones(16)
        allocations += 42
        stats = memwarden.ring_stats()
        if stats["cuts"] >= 20:
            break
    stats["allocations"] = allocations
    with open(stats_file, "w") as fh:
        json.dump(stats, fh)
    if mode == "fail":
        raise MemoryError("injected")
    with open(marker + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    while True:
        model(x)
        time.sleep(0.01)
    """
)


def _weights_kept(trace: memwarden.Trace) -> int:
    e = trace.events
    rows = (e["action"] == Action.ALLOC) & (e["category"] == Category.WEIGHT)
    return int(e["nbytes"][rows].sum())


def test_ring_bounds_the_recorder_and_keeps_weights_at_a_failure(tmp_path: Path) -> None:
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    out, stats_file = tmp_path / "run.mwtrace", tmp_path / "stats.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "memwarden.cli",
            "trace",
            "--ring",
            "0.5",
            "-o",
            str(out),
            str(script),
            "fail",
            str(tmp_path / "unused"),
            str(stats_file),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr
    assert "MemoryError" in proc.stderr
    stats = json.loads(stats_file.read_text())
    logged_bytes = stats["allocations"] * 2 * 64  # an alloc and a free row each, 64 bytes a row
    # The log never held more than a fraction of what went through it (documented bound: the rows
    # of 1.5 windows, twice that while the row vector doubles, plus one row per live block).
    assert stats["dropped_rows"] > stats["allocations"]
    assert 0 < stats["max_log_bytes"] < logged_bytes / 2
    trace = memwarden.load(out)
    assert trace.metadata["failure"]["kind"] == "MemoryError"
    ring = trace.metadata["ring"]
    assert ring["window_s"] == 0.5 and ring["cuts"] >= 20
    # The window accounts for the weights allocated before it began.
    assert _weights_kept(trace) == WEIGHTS
    weight_rows = (trace.events["category"] == Category.WEIGHT) & (trace.events["action"] == Action.ALLOC)
    assert int(trace.events["time_us"][weight_rows].max()) < ring["window_start_us"]
    assert trace.num_events < stats["allocations"]  # only the window's events, not the run's
    summary = json.loads(
        subprocess.run(
            [sys.executable, "-m", "memwarden.cli", "summary", "--json", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        ).stdout
    )
    assert summary["peak_bytes"] >= WEIGHTS


def test_ring_window_written_on_sigusr1_and_after_sigkill(tmp_path: Path) -> None:
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    out, marker, stats_file = tmp_path / "run.mwtrace", tmp_path / "ready", tmp_path / "stats.json"
    cmd = [
        sys.executable,
        "-m",
        "memwarden.cli",
        "trace",
        "--ring",
        "0.5",
        "-o",
        str(out),
        str(script),
        "serve",
        str(marker),
        str(stats_file),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dump = tmp_path / "run.sigusr1-1.mwtrace"
    try:
        while not marker.exists():  # waiting is on files, never on a clock
            assert proc.poll() is None, proc.communicate()
            os.sched_yield()
        proc.send_signal(signal.SIGUSR1)  # to memwarden trace, which passes it on to the script
        while not dump.exists():
            assert proc.poll() is None, proc.communicate()
            os.sched_yield()
        os.kill(int(marker.read_text()), signal.SIGKILL)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGKILL, stderr
    window = memwarden.load(dump)
    assert window.metadata["ring"]["written_for"] == "sigusr1"
    assert _weights_kept(window) == WEIGHTS
    final = memwarden.load(out)  # the stream the kill left: its last window, weights included
    assert final.metadata["exit_signal"] == signal.SIGKILL
    assert _weights_kept(final) == WEIGHTS


def test_ring_window_written_when_a_governed_session_refuses(tmp_path: Path) -> None:
    import pytest
    import torch

    from memwarden.models import zoo
    from memwarden.runtime.admission import AdmissionError
    from memwarden.runtime.session import GovernedSession

    model = zoo.build_model("llava", "tiny")  # weights: alive long before the window
    weight_bytes = sum(p.untyped_storage().nbytes() for p in model.parameters())
    inputs = zoo.make_inputs(model, prompt_tokens=40)
    session = GovernedSession(
        model, budget="1GiB", config=SessionConfig(num_kv_blocks=2)
    )  # a pool too small for the request
    stream = tmp_path / "svc.mwtrace"
    with torch.inference_mode(), memwarden.capture(ring_s=30, stream_to=stream):
        torch.ones(1 << 16)  # something in the window
        with pytest.raises(AdmissionError, match="tokens of KV cache"):
            session.generate(**inputs, max_new_tokens=4, **zoo.generate_kwargs("llava"))
        dump = tmp_path / "svc.refusal-1.mwtrace"
        assert dump.exists()  # written before the error reached the caller
        with pytest.raises(AdmissionError):  # a second refusal in the same window writes nothing new
            session.generate(**inputs, max_new_tokens=4, **zoo.generate_kwargs("llava"))
        stats = memwarden.ring_stats()
        assert stats is not None and stats["dumps"] == [str(dump)]
    window = memwarden.load(dump)
    assert window.metadata["ring"]["written_for"] == "refusal"
    assert "tokens of KV cache" in window.metadata["ring"]["detail"]
    e = window.events
    weights = (e["category"] == Category.WEIGHT) & np.isin(e["action"], [Action.ALLOC, Action.PREEXISTING])
    assert int(e["nbytes"][weights].sum()) >= weight_bytes  # the window accounts for the weights


WINDOW_RUN = textwrap.dedent(
    """
    import time
    import torch

    model = torch.nn.Linear(2048, 2048)  # weights: made at the start, ~9 s before the run ends
    x = torch.randn(4, 2048)
    for step in range(900):  # >= 9 s of 10 ms sleeps, each step a forward and a temporary
        with torch.no_grad():
            model(x)
        torch.ones(1024)
        time.sleep(0.01)
    """
)


def test_ring_trace_is_the_window_with_the_state_at_its_start(tmp_path: Path) -> None:
    """issue 41: ``--ring 3`` on a 9 s run spans the window (was 8.07 s: the state before it kept
    as events at their own times); the weights made before it are its state at time 0."""
    script = tmp_path / "window.py"
    script.write_text(WINDOW_RUN)
    out = tmp_path / "run.mwtrace"
    proc = subprocess.run(
        [sys.executable, "-m", "memwarden.cli", "trace", "--ring", "3", "-o", str(out), str(script)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    trace = memwarden.load(out)
    ring = trace.metadata["ring"]
    assert ring["window_start_us"] >= 5_000_000  # the sleeps alone last 9 s: the window is the end of it
    assert trace.metadata["duration_us"] <= 3_500_000
    assert int(trace.events["time_us"].max()) <= 3_500_000
    e = trace.events
    weights = (e["category"] == Category.WEIGHT) & np.isin(e["action"], [Action.ALLOC, Action.PREEXISTING])
    assert int(e["nbytes"][weights].sum()) == WEIGHTS  # the live state at the window's start
    assert int(e["time_us"][weights].max()) == 0
    window_rows = (e["action"] == Action.ALLOC) & (e["time_us"] > 0)
    assert int(window_rows.sum()) > 100  # the window's own events, at their times in it
    assert memwarden.summary(trace).peak_bytes >= WEIGHTS
