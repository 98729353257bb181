"""The README's Python examples run as written, on a real tiny model.

Each ```python block is executed as it stands; the names a reader brings (``model``,
``inputs``, the next turn's ``turn_ids`` and ``image``, a telemetry ``sample``) are defined
first, the way the README's prose describes them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from memwarden.govern.telemetry import TelemetrySample
from memwarden.models import zoo

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_examples() -> None:
    assert len(python_blocks()) >= 2


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_example_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    model = zoo.build_model("llava", size="tiny", seed=0)
    inputs = zoo.make_inputs(model, prompt_tokens=8, seed=0)
    turn = zoo.make_inputs(model, prompt_tokens=6, seed=1)
    namespace = {
        "model": model,
        "inputs": inputs,
        "turn_ids": turn["input_ids"],
        "image": turn["pixel_values"],
        "sample": TelemetrySample(t_s=0.0, mem_total_bytes=8 << 30, mem_available_bytes=4 << 30, temp_c=50.0),
    }
    with torch.inference_mode():
        exec(compile(python_blocks()[index], f"README.md python block {index}", "exec"), namespace)
    if "cap" in namespace:  # the capture example: the trace went to disk and came back whole
        assert (tmp_path / "run.mwtrace").stat().st_size > 0
        assert namespace["trace"].num_events == namespace["cap"].trace.num_events
        assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")
