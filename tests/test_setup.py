"""`make demo` needs Python and a C++ compiler only; the browser belongs to the test set-up."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")


def _bare_path(tmp_path: Path, *tools: str) -> str:
    """A PATH with only ``tools`` on it: no apt-get, dnf, brew, sudo or Chromium."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


@pytest.mark.skipif(MAKE is None, reason="no make on PATH")
def test_make_demo_never_installs_system_packages(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": _bare_path(tmp_path, "make", "sh", "bash", "python3")}
    for target in ("install", "demo"):
        plan = subprocess.run([str(MAKE), "-n", target], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert plan.returncode == 0, plan.stderr
        assert "chromium" not in plan.stdout and "apt-get" not in plan.stdout, plan.stdout
        assert "sudo" not in plan.stdout
    plan = subprocess.run([str(MAKE), "-n", "test"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert "install-chromium.sh" in plan.stdout  # the browser comes with the test set-up


def test_browser_set_up_without_a_package_manager_says_so_and_succeeds(tmp_path: Path) -> None:
    env = {"PATH": _bare_path(tmp_path, "bash"), "HOME": str(tmp_path)}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install-chromium.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "no package manager found" in proc.stderr and "browser tests will skip" in proc.stderr
