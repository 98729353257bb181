"""GovernedSession on a GPU: the KV pool on the device, the budget from the device's free memory,
weights streamed from pinned host memory through device slots, and the greedy tokens of plain
``model.generate()``. The peak is PyTorch's own ``max_memory_allocated`` over the serving, and
``max_memory_reserved`` (what the device really lost) is checked against the budget too: the
session caps the caching allocator's reserve at the budget while it serves
(``runtime/cuda_reserve.py``) and puts the process's memory fraction back when it closes.

Tests marked ``cuda`` run where a GPU is present (scripts/gpu-check.sh runs them); the
device-free parts (the limit the session reads on CPU) run everywhere.
"""

from __future__ import annotations

import pytest
import torch

from memwarden.models import zoo
from memwarden.runtime.host_memory import limit_cap, state_bytes, warm_cuda_runtime
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.session_config import SessionConfig

NEW = 8


def _to(inputs: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in inputs.items()}


def test_the_cpu_limit_is_not_read_from_a_gpu() -> None:
    """On CPU the cap is the process's cgroup / RLIMIT_AS (or none), never a device query."""
    cap, kind = limit_cap(123, torch.device("cpu"))
    assert kind != "GPU's free memory (cudaMemGetInfo)"
    assert cap is None or cap >= 123
    assert warm_cuda_runtime(torch.device("cpu")) == 0  # no CUDA runtime to warm


@pytest.mark.cuda
def test_the_cublas_workspaces_are_allocated_once_when_warmed() -> None:
    device = torch.device("cuda")
    warm_cuda_runtime(device, torch.bfloat16)
    assert warm_cuda_runtime(device, torch.bfloat16) == 0  # kept by PyTorch: the session counts them once


def _served(name: str, budget_of: float, *, stream: bool | str = "auto") -> dict:
    model = zoo.build_model(name, "small").to("cuda")
    gk = zoo.generate_kwargs(name)
    inputs = _to(zoo.make_inputs(model, prompt_tokens=40), "cuda")
    weights = state_bytes(model)
    with torch.inference_mode():
        ref = model.generate(**inputs, max_new_tokens=NEW, **gk)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base_allocated = torch.cuda.memory_allocated() - weights  # the inputs and anything else not the session's
    budget = int(weights * budget_of)
    with torch.inference_mode():
        session = GovernedSession(
            model,
            budget=budget,
            example_inputs=dict(inputs, max_new_tokens=NEW),
            config=SessionConfig(stream=stream, min_kv_tokens=256),
        )
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()  # the serving's peak (the weights were on the device before the session)
        first = session.generate(**inputs, max_new_tokens=NEW, **gk)
        again = session.generate(**inputs, max_new_tokens=NEW, **gk)
        torch.cuda.synchronize()
        peak_allocated = torch.cuda.max_memory_allocated() - base_allocated
        peak_reserved = torch.cuda.max_memory_reserved() - base_allocated  # the base holds its reserved bytes too
        streamer = session.streamer
        stats = None if streamer is None else streamer.stats
        fraction_serving = torch.cuda.get_per_process_memory_fraction()
        restored = session.close()
        fraction_after = torch.cuda.get_per_process_memory_fraction()
        after = model.generate(**inputs, max_new_tokens=NEW, **gk)
    return dict(
        ref=ref,
        first=first,
        again=again,
        after=after,
        budget=budget,
        weights=weights,
        session=session,
        peak_allocated=peak_allocated,
        peak_reserved=peak_reserved,
        stats=stats,
        restored=restored,
        fraction_serving=fraction_serving,
        fraction_after=fraction_after,
    )


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["llava", "qwen2-vl"])
def test_resident_session_on_cuda_equals_generate_under_the_budget(name: str) -> None:
    r = _served(name, 1.6)
    assert r["session"].pool.data.device.type == "cuda"
    assert r["session"].streamer is None
    assert torch.equal(r["first"].cpu(), r["ref"].cpu()) and torch.equal(r["again"].cpu(), r["ref"].cpu())
    if name == "llava":  # Qwen2-VL's positions depend on its media: no reuse past the image (runtime/media.py)
        assert r["session"].records[1].reused_tokens > 0  # the repeat found its prefix in the device pool
    assert r["peak_allocated"] <= r["budget"]
    assert r["peak_reserved"] <= r["budget"]  # what the device lost, the allocator's cache included
    assert r["fraction_serving"] < 1.0 and r["fraction_after"] == 1.0  # the cap held it, and was put back


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["llava", "qwen2-vl"])
def test_streamed_weights_on_cuda_equal_generate_under_the_budget(name: str) -> None:
    r = _served(name, 0.75, stream=True)
    stats = r["stats"]
    assert stats is not None and stats.loads > 0
    assert stats.prefetch_hits > 0  # the side stream had most groups in place before they ran
    assert torch.equal(r["first"].cpu(), r["ref"].cpu()) and torch.equal(r["again"].cpu(), r["ref"].cpu())
    assert r["peak_allocated"] <= r["budget"]
    assert r["peak_reserved"] <= r["budget"]
    assert r["restored"].streamed_weights_restored
    assert r["fraction_after"] == 1.0  # the cap went first: the weights came back past the budget
    assert torch.equal(r["after"].cpu(), r["ref"].cpu())  # close() put every weight back on the device


@pytest.mark.cuda
def test_the_budget_is_capped_by_the_devices_free_memory() -> None:
    model = zoo.build_model("llava", "tiny").to("cuda")
    free, _ = torch.cuda.mem_get_info()
    cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    session = GovernedSession(model, budget="100TiB")
    try:
        assert session.budget_bytes <= free + cached + state_bytes(model)
        assert any("cudaMemGetInfo" in e["label"] for e in session.events)
    finally:
        session.close()


@pytest.mark.cuda
def test_two_caps_on_one_device_put_back_the_users_fraction_when_the_last_closes() -> None:
    from memwarden.runtime.cuda_reserve import ReserveCap

    device = torch.device("cuda")
    torch.cuda.set_per_process_memory_fraction(0.9)  # the user's own cap
    try:
        first, second = ReserveCap(device), ReserveCap(device)
        assert first.prior == second.prior == pytest.approx(0.9)  # neither takes the other's cap for the user's
        first.apply(budget=2**30, held=0)
        second.apply(budget=2**29, held=0)
        assert torch.cuda.get_per_process_memory_fraction() == second.fraction < 0.9
        first.release()
        assert torch.cuda.get_per_process_memory_fraction() == second.fraction  # still serving under its cap
        second.release()
        assert torch.cuda.get_per_process_memory_fraction() == pytest.approx(0.9)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
