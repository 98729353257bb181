"""The native capture hook: built on first use with one line saying so, and where it cannot be built
(no C++ compiler) capture falls back to the pure-Python recorder with one warning, not a failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import memwarden
from memwarden.record import native, python_recorder

SCRIPT = """\
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
with torch.no_grad():
    for _ in range(3):
        y = model(torch.randn(32, 64))
print("done", tuple(y.shape))
"""
WEIGHT_BYTES = (64 * 256 + 256 + 256 * 8 + 8) * 4  # the two Linear layers, float32


@pytest.fixture
def fresh_native(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No build of the hook in the cache, and ``load`` asked afresh; put back as it was afterwards."""
    monkeypatch.setenv("MEMWARDEN_CACHE", str(tmp_path / "cache"))
    native.load.cache_clear()
    saved = list(native._FAILED)
    native._FAILED.clear()
    yield
    native._FAILED[:] = saved
    native.load.cache_clear()


def test_trace_without_a_compiler_falls_back_with_one_warning(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out = tmp_path / "t.mwtrace"
    env = {**os.environ, "CXX": "/nonexistent/c++", "MEMWARDEN_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "memwarden", "trace", "-o", str(out), str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "done (32, 8)" in done.stdout
    lines = done.stderr.splitlines()
    warnings = [line for line in lines if "warning" in line.lower() or "native" in line.lower()]
    assert len(warnings) == 1, done.stderr
    assert "no C++ compiler" in warnings[0] and "pure-Python recorder" in warnings[0]
    assert native.BUILD_NOTICE not in done.stderr  # nothing to build with: no build was tried
    assert "Traceback" not in done.stderr
    trace = memwarden.load(out)
    assert trace.metadata["capture"] == python_recorder.PYTHON_CAPTURE
    summary = memwarden.summary(trace)
    assert summary.weights_bytes == WEIGHT_BYTES
    assert summary.peak_bytes > WEIGHT_BYTES  # the activations of the forward passes are on top


def test_a_first_capture_says_it_builds_the_hook_before_building(
    fresh_native: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from torch.utils import cpp_extension

    monkeypatch.setenv("CXX", sys.executable)  # any program that exists: the build itself is faked
    seen: list[str] = []
    built = SimpleNamespace(__file__="fake.so")

    def fake_build(**kwargs: Any) -> Any:
        seen.append(capsys.readouterr().err)  # what stderr had when the build began
        return built

    monkeypatch.setattr(cpp_extension, "load", fake_build)
    assert native.load() is built
    assert seen == [native.BUILD_NOTICE + "\n"]
    assert native.load() is built  # kept: no second build, no second line
    assert capsys.readouterr().err == ""


def test_a_failed_build_is_tried_once_and_capture_falls_back(
    fresh_native: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from torch.utils import cpp_extension

    monkeypatch.setenv("CXX", sys.executable)
    builds: list[int] = []

    def failing_build(**kwargs: Any) -> Any:
        builds.append(1)
        raise RuntimeError("Error building extension 'memwarden_native'\nc++: fatal error: no input files")

    monkeypatch.setattr(cpp_extension, "load", failing_build)
    monkeypatch.setattr(python_recorder, "_warned", [])
    model = torch.nn.Linear(16, 32)
    with memwarden.capture() as cap:
        model(torch.randn(4, 16))
    with memwarden.capture() as again:
        model(torch.randn(4, 16))
    assert builds == [1]
    err = capsys.readouterr().err.splitlines()
    assert err[0] == native.BUILD_NOTICE
    assert len(err) == 2 and "pure-Python recorder" in err[1] and "Error building extension" in err[1]
    for trace in (cap.trace, again.trace):
        assert trace is not None and trace.metadata["capture"] == python_recorder.PYTHON_CAPTURE
        assert memwarden.summary(trace).weights_bytes == (16 * 32 + 32) * 4


def test_the_python_recorder_sees_the_blocks_the_native_one_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same run under both recorders: the same weights, and a peak of tensor storages no higher
    than the native one's (which adds the blocks a kernel allocates and frees inside one op)."""
    import memwarden.record.live.capture as capture_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    x = torch.randn(32, 64)

    def run() -> None:
        with torch.no_grad():
            for _ in range(2):
                model(x)

    with memwarden.capture() as live:
        run()
    monkeypatch.setattr(capture_module, "recorder", lambda metadata: python_recorder.PythonRecorder())
    with memwarden.capture() as py:
        run()
    a, b = memwarden.summary(live.trace), memwarden.summary(py.trace)
    assert a.weights_bytes == b.weights_bytes == WEIGHT_BYTES
    activations = (a.peak_bytes - a.weights_bytes, b.peak_bytes - b.weights_bytes)
    assert 0 < activations[1] <= activations[0], activations
