"""Post-mortem capture: ``memwarden trace`` leaves a trace however the script ends.

Every crash here is deterministic: the script calls ``memwarden.flush()`` (or ends a model step,
which flushes) before it dies, and a kill from outside waits on a file the script writes after
its flush, so no test depends on timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import memwarden
from memwarden.trace.stream import STREAM_MAGIC


def run_cli(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memwarden.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


MIB = 1 << 20
KEPT = 24 * MIB  # what the script holds when it dies: 6 blocks of 4 MiB

SCRIPT = textwrap.dedent(
    """
    import ctypes, os, signal, sys, time
    import torch
    import memwarden

    kept = [torch.ones(4 << 20, dtype=torch.uint8) for _ in range(6)]
    model = torch.nn.Linear(64, 64)
    model(torch.randn(4, 64))  # a step: flushes the stream
    assert memwarden.flush()
    mode = sys.argv[1]
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "abort":
        os.abort()
    elif mode == "segv":
        ctypes.string_at(0)
    elif mode == "exit":
        os._exit(3)
    elif mode == "memory":
        raise MemoryError("planted")
    elif mode == "sysexit":
        sys.exit(5)
    elif mode == "outside":
        Path = __import__("pathlib").Path
        Path(sys.argv[2] + ".tmp").write_text(str(os.getpid()))
        os.replace(sys.argv[2] + ".tmp", sys.argv[2])
        while True:  # grows until killed from outside
            kept.append(torch.ones(1 << 16, dtype=torch.uint8))
            time.sleep(0.01)
    print("finished")
    """
)


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("postmortem") / "crash.py"
    path.write_text(SCRIPT)
    return path


def _trace(script: Path, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "run.mwtrace"
    proc = run_cli("trace", "-o", str(out), str(script), *args, cwd=str(tmp_path))
    return proc, out


def _check(out: Path, signal_number: int | None) -> memwarden.Trace:
    trace = memwarden.load(out)
    assert trace.metadata["exit_signal"] == signal_number
    assert trace.metadata["oom_killed"] in (True, False, None)
    if signal_number != signal.SIGKILL:
        assert trace.metadata["oom_killed"] is False
    assert memwarden.summary(trace).peak_bytes >= KEPT
    return trace


@pytest.mark.parametrize(
    ("mode", "status", "signal_number"),
    [
        ("kill", 128 + signal.SIGKILL, signal.SIGKILL),
        ("abort", 128 + signal.SIGABRT, signal.SIGABRT),
        ("segv", 128 + signal.SIGSEGV, signal.SIGSEGV),
        ("exit", 3, None),
    ],
)
def test_crash_leaves_trace(script: Path, tmp_path: Path, mode: str, status: int, signal_number: int | None) -> None:
    proc, out = _trace(script, tmp_path, mode)
    assert proc.returncode == status, proc.stderr
    assert out.read_bytes()[:8] == b"MWTRACE\0"  # the supervisor finished the stream into a trace
    trace = _check(out, signal_number)
    assert trace.metadata["exit_status"] == status
    assert trace.metadata["recovered"]["from"] == "stream"
    assert trace.metadata["resident_last_bytes"] > 0


def test_killed_from_outside_while_growing(script: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ready"
    out = tmp_path / "run.mwtrace"
    cmd = [sys.executable, "-m", "memwarden.cli", "trace", "-o", str(out), str(script), "outside", str(marker)]
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), stderr=subprocess.PIPE, text=True)
    try:
        while not marker.exists():  # written after the flush: waiting is on the file, not a clock
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            subprocess.run(["sleep", "0.05"], check=True)
        os.kill(int(marker.read_text()), signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 137, err
    trace = _check(out, signal.SIGKILL)
    if trace.metadata["oom_killed"] is False:  # the counters were read and did not move: a hand kill
        assert "died of memory" not in err and "not by the OOM killer" in err


def test_a_hand_kill_is_not_an_oom() -> None:
    """issue 41: a SIGKILL the OOM counters do not count is a kill, never "died of memory", even
    after resident memory grew; an OOM the counters count is one; unreadable counters after growth
    are a likely OOM, said as such."""
    from memwarden.analyze.postmortem import died_of_memory, killed_lines
    from memwarden.trace.model import TraceBuilder

    def trace(oom: bool | None) -> memwarden.Trace:
        meta = {
            "exit_signal": int(signal.SIGKILL),
            "oom_killed": oom,
            "resident": {"samples": {"rss": [100 << 20, 200 << 20, 400 << 20]}},
        }
        return TraceBuilder(metadata=meta).build()

    assert died_of_memory(trace(False)) is None
    assert killed_lines(trace(False)) == [
        "memwarden: the script was killed by signal 9 (SIGKILL), not by the OOM killer (the kernel's OOM "
        "counters did not move)"
    ]
    assert "OOM killer" in (died_of_memory(trace(True)) or "") and killed_lines(trace(True)) == []
    # the line names where the supervisor looked, and a flat resident set
    flat = TraceBuilder(
        metadata={
            "exit_signal": int(signal.SIGKILL),
            "oom_killed": False,
            "oom_evidence": "kernel log",
            "resident": {"samples": {"rss": [100 << 20, 101 << 20, 100 << 20]}},
        }
    ).build()
    assert killed_lines(flat) == [
        "memwarden: the script was killed by signal 9 (SIGKILL), not by the OOM killer (no OOM kill in the kernel "
        "log; resident memory was flat)"
    ]
    assert "could not be read" in (died_of_memory(trace(None)) or "")


def test_memory_error_is_explained(script: Path, tmp_path: Path) -> None:
    proc, out = _trace(script, tmp_path, "memory")
    assert proc.returncode == 1
    assert "MemoryError: planted" in proc.stderr
    assert "died of memory" in proc.stderr and "aten::ones" in proc.stderr
    trace = _check(out, None)
    assert trace.metadata["failure"]["kind"] == "MemoryError"
    assert "recovered" not in trace.metadata  # the child stopped its capture: the complete trace


def test_sys_exit_status_and_commands_on_a_crash_trace(script: Path, tmp_path: Path) -> None:
    proc, out = _trace(script, tmp_path, "sysexit")
    assert proc.returncode == 5
    assert _check(out, None).metadata["exit_status"] == 5
    proc, out = _trace(script, tmp_path, "kill")
    assert proc.returncode == 137
    summary = run_cli("summary", "--json", str(out))
    assert summary.returncode == 0, summary.stderr
    assert json.loads(summary.stdout)["peak_bytes"] >= KEPT
    for args in (
        ["diagnose", "--json", str(out)],
        ["replay", str(out)],
        ["report", "-o", str(tmp_path / "r.html"), str(out)],
    ):
        done = run_cli(*args)
        assert done.returncode == 0, (args, done.stderr)


def test_module_runs_like_python_m(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg_pm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(
        "import sys, torch\nx = torch.ones(1 << 22, dtype=torch.uint8)\nsys.exit(len(sys.argv))\n"
    )
    out = tmp_path / "m.mwtrace"
    proc = run_cli("trace", "-o", str(out), "-m", "pkg_pm", "a", "b", cwd=str(tmp_path))
    assert proc.returncode == 3, proc.stderr  # argv = [module, a, b]
    assert memwarden.summary(memwarden.load(out)).peak_bytes >= 1 << 22


IN_PROCESS = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    import memwarden

    weights = torch.ones(8 << 20, dtype=torch.uint8)  # alive before the capture: still counted
    cap = memwarden.capture(stream_to=sys.argv[1])
    cap.__enter__()
    kept = [torch.ones(4 << 20, dtype=torch.uint8) for _ in range(4)]
    memwarden.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_in_process_stream_recovered_by_load(tmp_path: Path) -> None:
    script = tmp_path / "inproc.py"
    script.write_text(IN_PROCESS)
    stream = tmp_path / "self.mwtrace"
    proc = subprocess.run([sys.executable, str(script), str(stream)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL
    data = stream.read_bytes()
    assert data[:8] == STREAM_MAGIC
    trace = memwarden.load(stream)
    assert trace.metadata["recovered"]["complete"] is False
    assert memwarden.summary(trace).peak_bytes >= 8 * MIB + 16 * MIB
    # A torn last write (the writer killed mid-chunk): every whole chunk still loads.
    stream.write_bytes(data + data[8:60])
    torn = memwarden.load(stream)
    assert torn.metadata["recovered"]["dropped_bytes"] == 52
    assert memwarden.summary(torn).peak_bytes == memwarden.summary(trace).peak_bytes
    summary = run_cli("summary", "--json", str(stream))
    assert summary.returncode == 0, summary.stderr


def test_a_streams_steps_recover_as_the_capture_ends_them(tmp_path: Path) -> None:
    """Steps go to the stream as rows; a copy of the stream taken mid-run recovers each of them
    as the finished capture records it (phase, span, tokens, inputs, grad mode, call site)."""
    import shutil

    import torch

    from memwarden.trace.steps import steps_of

    model = torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Linear(8, 8))
    path, copy = tmp_path / "s.mwtrace", tmp_path / "copy.mwtrace"
    with memwarden.capture(stream_to=path) as cap:
        with torch.no_grad():
            for n in range(1, 6):
                model(torch.arange(n).unsqueeze(0))
        memwarden.flush()
        shutil.copy(path, copy)
    assert cap.trace is not None
    recovered, final = steps_of(memwarden.load(copy)), steps_of(cap.trace)
    assert len(recovered) == len(final) == 5
    assert [s.to_json() for s in recovered] == [s.to_json() for s in final]
    assert [s.seq_len for s in final] == [1, 2, 3, 4, 5]


FLAT = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import memwarden

    kept = [torch.ones(4 << 20, dtype=torch.uint8) for _ in range(6)]
    assert memwarden.flush()
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    while True:  # flat: nothing more is allocated until the kill
        time.sleep(1)
    """
)


def test_a_hand_kill_of_a_flat_script_is_not_an_oom_anywhere(tmp_path: Path) -> None:
    """issue 41: ``kill -9`` by hand of a script whose memory is flat, through the real CLI: the
    terminal says which signal and that it was not the OOM killer, ``oom_killed`` is false where
    any evidence could be read, and neither diagnose nor the report calls it an OOM."""
    script, marker, out = tmp_path / "flat.py", tmp_path / "ready", tmp_path / "flat.mwtrace"
    script.write_text(FLAT)
    cmd = [sys.executable, "-m", "memwarden.cli", "trace", "-o", str(out), str(script), str(marker)]
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), stderr=subprocess.PIPE, text=True)
    try:
        while not marker.exists():  # written after the flush: waiting is on the file, not a clock
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            subprocess.run(["sleep", "0.05"], check=True)
        os.kill(int(marker.read_text()), signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 137, err
    assert "killed by signal 9 (SIGKILL), not by the OOM killer" in err, err
    assert "died of memory" not in err
    meta = memwarden.load(out).metadata
    assert meta["exit_signal"] == signal.SIGKILL
    if meta.get("oom_evidence") is not None:  # the kernel log or an OOM counter was read
        assert meta["oom_killed"] is False
    else:
        assert meta["oom_killed"] is None
    diagnosed = run_cli("diagnose", "--json", str(out))
    assert diagnosed.returncode == 0, diagnosed.stderr
    report = tmp_path / "r.html"
    assert run_cli("report", "-o", str(report), str(out)).returncode == 0
    for text in (diagnosed.stdout, report.read_text()):
        low = text.lower()
        assert "died of memory" not in low and "out of memory" not in low and "oom kill" not in low
