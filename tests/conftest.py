"""Test settings shared by every test: offline, deterministic, CPU by default."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from memwarden.runtime.session_config import SessionConfig

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


@pytest.fixture(scope="module", autouse=True)
def _collected_process() -> None:
    """Each test file starts from a collected process. Garbage cycles an earlier file left (models,
    tensors) are memory a live capture counts as the process's, so exact figures would depend on
    which files ran before in the same process: pytest-xdist (make test) orders them anew each run."""
    import gc

    gc.collect()


@pytest.fixture(scope="session")
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no chromium binary (make install installs Debian's chromium)")
    return path


@dataclass
class ServedSession:
    """A governed session of the tiny llava zoo model (1 GiB budget, encoder cache on) exposing its
    Prometheus metrics on a free 127.0.0.1 port, and the request it serves."""

    session: Any  # GovernedSession
    metrics: Any  # runtime.metrics.SessionMetrics
    inputs: dict[str, Any]
    name: str = "llava"

    def serve(self) -> None:
        """One request of 3 new tokens (the same image and prompt each time: prefix blocks reused)."""
        import torch

        from memwarden.models import zoo

        with torch.inference_mode():
            self.session.generate(**self.inputs, max_new_tokens=3, **zoo.generate_kwargs(self.name))


@pytest.fixture(scope="module")
def served_session() -> Iterator[ServedSession]:
    """One served session per test module (tests/test_metrics.py, tests/test_top.py)."""
    from memwarden.models import zoo
    from memwarden.runtime.metrics import serve_metrics
    from memwarden.runtime.session import GovernedSession

    model = zoo.build_model("llava")
    inputs = zoo.make_inputs(model, prompt_tokens=24)
    with GovernedSession(model, budget="1GiB", config=SessionConfig(encoder_cache=True)) as session:
        metrics = serve_metrics(session, 0)
        try:
            yield ServedSession(session, metrics, inputs)
        finally:
            metrics.stop()
