"""issue 44: ``make demo`` installs what the demo runs on (memwarden and its runtime dependencies, as
``pip install .`` does, and the native hook), never the test tools; ``make test`` still installs them.
Dry runs (``make -n``) into an empty folder, as on a fresh clone: nothing is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
# what only the test set-up brings: the [test] extra and the quantization libraries kept apart
TEST_TOOLS = ('".[test]"', "torchao", "hqq", "bitsandbytes", "compressed-tensors")

pytestmark = pytest.mark.skipif(MAKE is None, reason="no make on PATH")


def _plan(target: str, venv: Path) -> str:
    proc = subprocess.run(
        [str(MAKE), "-n", "--no-print-directory", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")},  # run by make
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_make_demo_on_a_fresh_clone_installs_the_runtime_only(tmp_path: Path) -> None:
    plan = _plan("demo", tmp_path / "venv")
    assert "-m venv" in plan and "-c constraints.txt torch" in plan
    assert "-c constraints.txt -e .\n" in plan  # the package, no extra
    assert "memwarden.record.native --build" in plan
    assert plan.rstrip().endswith("memwarden demo")
    for tool in TEST_TOOLS:
        assert tool not in plan, tool


def test_make_test_still_installs_the_test_tools(tmp_path: Path) -> None:
    plan = _plan("test", tmp_path / "venv")
    assert "-c constraints.txt -e .\n" in plan  # the runtime set-up first
    for tool in TEST_TOOLS:
        assert tool in plan, tool
    assert plan.index("-e .\n") < plan.index('-e ".[test]"') < plan.index("-m pytest")
