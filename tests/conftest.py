"""Test settings shared by every test: offline, deterministic, CPU by default."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip_cuda = pytest.mark.skip(reason="needs a CUDA device; none here")
    for item in items:
        if "cuda" in item.keywords and not has_cuda:
            item.add_marker(skip_cuda)


def run_cli(*args: str, cwd: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `python -m memwarden.cli ARGS` as a real subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "memwarden.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no chromium binary (make install installs Debian's chromium)")
    return path
