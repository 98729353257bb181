"""estimate's CUDA runtime lines against a real GPU run.

The real figures were recorded on an H200 by scripts/gpu-check.sh (tests/fixtures/
cuda_estimate_runs.json): each zoo run's own ``max_memory_allocated``/``max_memory_reserved``,
and the probe's cuBLAS workspaces and context. Here the same requests run on the meta device,
with the H200's profile, and the card's allocated and reserved peaks are compared with them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from memwarden.estimation import run as est
from memwarden.estimation.build import card_from_trace
from memwarden.estimation.cuda_runtime import CUBLASLT_WORKSPACE_BYTES, MEASURED_CONTEXT_BYTES, cublas_workspace_bytes
from memwarden.models import zoo
from memwarden.models.devices import load_profile
from memwarden.record.meta import capture as meta

FACTS = json.loads((Path(__file__).parent / "fixtures" / "cuda_estimate_runs.json").read_text())
RUNS = {r["model"]: r for r in FACTS["runs"]}


def test_workspaces_and_context_are_the_measured_ones() -> None:
    probe = FACTS["probe"]
    assert cublas_workspace_bytes(tuple(probe["capability"])) == probe["workspace_float32"]["linear"]
    assert CUBLASLT_WORKSPACE_BYTES == probe["workspace_float32"]["addmm"]
    assert abs(MEASURED_CONTEXT_BYTES - probe["context_bytes"]) < 2**20


@pytest.mark.parametrize("run", sorted(RUNS))
def test_card_on_the_h200_matches_the_real_runs_peaks(run: str) -> None:
    name, size, mode = run.split("/")
    config = zoo.build_config(name, size)
    inputs = meta.meta_inputs(zoo.make_inputs(config, size=size))
    model = meta.build_meta_model(config)
    with meta.MetaCapture(model, inputs) as cap, torch.inference_mode():
        if mode == "forward":
            model(**inputs)
        else:
            model.generate(**inputs, max_new_tokens=4, **zoo.generate_kwargs(name))
    card = card_from_trace(cap.trace, device=load_profile("h200-141gb"))
    real = RUNS[run]
    assert card.runtime is not None
    for ours, theirs in (
        (card.runtime["allocated_peak_bytes"], real["max_memory_allocated"]),
        (card.runtime["reserved_peak_bytes"], real["max_memory_reserved"]),
    ):
        assert abs(ours - theirs) <= 0.02 * theirs, (run, ours, theirs)
    # without the runtime lines the tensors alone read 13-95 % low on these small models
    assert card.peak_bytes < 0.9 * real["max_memory_allocated"]
    assert card.headroom_bytes == card.usable_bytes - card.runtime["reserved_peak_bytes"]


def test_cpu_devices_get_no_cuda_lines_and_the_json_says_so() -> None:
    card = est.estimate("llava", images=[(32, 32)], prompt_tokens=12, new_tokens=2, device="raspberry-pi-5-8gb")
    assert card.runtime is None and card.to_json()["runtime"] is None
    gpu = est.estimate("llava", images=[(32, 32)], prompt_tokens=12, new_tokens=2, device="rtx-4090-24gb")
    assert gpu.runtime is not None and gpu.runtime["cublas_workspace_bytes"] == 8 * 2**20 + 128 * 1024
    assert "cuBLAS workspace" in gpu.to_text()
