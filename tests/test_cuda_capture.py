"""Live CUDA capture: the merge of the memory history with the CPU capture's spans, and the KV
pool resize staged through the host.

The merge runs here without a GPU on material recorded on one (tests/fixtures/cuda_*: an H200
run of the tiny LLaVA moved to CUDA and run once inside ``CudaCapture``, written by
scripts/gpu-check.sh): the memory history as ``torch.cuda.memory._snapshot()`` returned it, the
CPU trace recorded at the same time, and what the run measured (clock anchors, the parameters
found on the device, ``max_memory_allocated``/``max_memory_reserved``). Tests marked ``cuda``
repeat the live run where a GPU is present.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from memwarden.analyze.timeline import summary
from memwarden.interop.snapshot import load_snapshot
from memwarden.plan.replay import replay
from memwarden.record.cuda.merge import BlockTag, ClockAnchor, anchor_from_marker, merge_cuda, peak_reserved_bytes
from memwarden.runtime.kvcache import KVPool, KVSpec
from memwarden.trace.io import load
from memwarden.trace.model import Action, Category, Modality, Phase, SpanKind, Trace

FIXTURES = Path(__file__).parent / "fixtures"
HISTORY = FIXTURES / "cuda_history.pickle"


@pytest.fixture(scope="module")
def recorded() -> tuple[Trace, Trace, dict]:
    facts = json.loads((FIXTURES / "cuda_run.json").read_text())
    return load(FIXTURES / "cuda_cpu.mwtrace"), load_snapshot(HISTORY), facts


@pytest.fixture(scope="module")
def merged(recorded: tuple[Trace, Trace, dict]) -> Trace:
    cpu, cuda, facts = recorded
    anchors = [ClockAnchor.from_json(a) for a in facts["anchors"]]
    tags = [BlockTag.from_json(t) for t in facts["tags"]]
    return merge_cuda(cpu, cuda, anchors, tags, drop_cpu_bytes=facts["marker_bytes"])


def test_fixture_is_small_and_plain() -> None:
    assert HISTORY.stat().st_size < 64 * 1024
    with open(HISTORY, "rb") as fh:
        snapshot = pickle.load(fh)
    kinds = {e["action"] for entries in snapshot["device_traces"] for e in entries}
    assert {"alloc", "free_requested", "free_completed", "segment_alloc"} <= kinds


def test_cpu_and_cuda_rows_share_one_trace_with_the_device_column(recorded, merged: Trace) -> None:
    cpu, cuda, facts = recorded
    gpu = merged.device_index("cuda:0")
    on_gpu = merged.events["device"] == gpu
    assert int(on_gpu.sum()) == cuda.num_events
    markers = np.isin(cpu.events["nbytes"], facts["marker_bytes"]) & (cpu.events["action"] == Action.ALLOC)
    assert int((~on_gpu).sum()) == cpu.num_events - 2 * int(markers.sum())  # each marker's ALLOC and FREE
    assert np.all(np.diff(merged.events["time_us"]) >= 0)
    assert merged.num_spans == cpu.num_spans and merged.metadata["device"] == "cuda:0"
    cpu_summary = summary(merged, device=merged.device_index("cpu"))
    assert cpu_summary.device == "cpu" and cpu_summary.peak_bytes > 0


def test_peak_allocated_and_reserved_match_what_torch_measured(merged: Trace, recorded) -> None:
    facts = recorded[2]
    gpu = merged.device_index("cuda:0")
    peak = summary(merged, device=gpu).peak_bytes
    assert abs(peak - facts["max_memory_allocated"]) <= 0.01 * facts["max_memory_allocated"]
    assert peak_reserved_bytes(merged, gpu) == facts["max_memory_reserved"]


def test_each_cuda_block_gets_the_innermost_module_span_open_at_its_allocation(merged: Trace) -> None:
    e, s = merged.events, merged.spans
    gpu = merged.device_index("cuda:0")
    modules = np.flatnonzero(s["kind"] == SpanKind.MODULE)
    rows = np.flatnonzero((e["device"] == gpu) & (e["action"] == Action.ALLOC) & (e["category"] != Category.WEIGHT))
    checked = 0
    for r in rows.tolist():
        t = e["time_us"][r]
        open_spans = [i for i in modules.tolist() if s["start_us"][i] <= t < s["end_us"][i]]
        if open_spans:
            depth = max(int(s["depth"][i]) for i in open_spans)
            assert int(e["module"][r]) in {int(s["name"][i]) for i in open_spans if s["depth"][i] == depth}
            assert e["category"][r] == Category.ACTIVATION
            checked += 1
    assert checked >= 10  # the forward pass ran inside module spans
    kinds = {Modality(int(m)) for m in e["modality"][rows]}
    assert Modality.VISION in kinds and Modality.TEXT in kinds
    assert Phase.PREFILL in {Phase(int(p)) for p in e["phase"][rows]}


def test_free_rows_repeat_their_blocks_attribution(merged: Trace) -> None:
    e = merged.events
    gpu = e["device"] == merged.device_index("cuda:0")
    start = {int(t): r for r in np.flatnonzero(gpu & (e["action"] == Action.ALLOC)) for t in [e["tensor"][r]]}
    frees = np.flatnonzero(gpu & (e["action"] == Action.FREE))
    assert len(frees) > 0
    for r in frees.tolist():
        s = start.get(int(e["tensor"][r]))
        if s is not None:
            for column in ("module", "modality", "phase", "category", "nbytes"):
                assert e[column][r] == e[column][s], column


def test_weights_moved_to_the_gpu_are_weights_of_their_modules(merged: Trace, recorded) -> None:
    facts = recorded[2]
    gpu = merged.device_index("cuda:0")
    e = merged.events
    weights = (e["device"] == gpu) & (e["action"] == Action.ALLOC) & (e["category"] == Category.WEIGHT)
    assert int(weights.sum()) == len([t for t in facts["tags"] if t["category"] == int(Category.WEIGHT)])
    names = {merged.string(int(m)) or "" for m in e["module"][weights]}
    assert any("vision_tower" in n for n in names) and any("language_model" in n for n in names)
    # storages as PyTorch sized them, each block rounded up to at most 511 B more by the allocator
    weights_bytes = summary(merged, device=gpu).weights_bytes
    assert facts["parameter_bytes"] <= weights_bytes <= facts["parameter_bytes"] + 512 * len(facts["tags"])


def test_the_allocator_model_reserves_what_the_gpu_reserved(merged: Trace, recorded) -> None:
    facts = recorded[2]
    predicted = replay(merged, device=merged.device_index("cuda:0"))
    assert predicted.peak_reserved_bytes == facts["max_memory_reserved"]


def test_clock_anchor_from_a_real_cpu_capture() -> None:
    from memwarden.record.live.capture import Capture

    marker_bytes = 77_771
    with Capture() as cap:
        before = time.time_ns()
        marker = torch.empty(marker_bytes, dtype=torch.uint8)
        after = time.time_ns()
        del marker
    anchor = anchor_from_marker(cap.trace, marker_bytes, before, after)
    assert anchor is not None
    assert before // 1000 <= anchor.wall_us <= after // 1000
    assert 0 <= anchor.trace_us <= int(cap.trace.events["time_us"].max())
    assert anchor_from_marker(cap.trace, marker_bytes + 2, before, after) is None


# -- KV pool resize ---------------------------------------------------------------------


def _filled_pool(device: str) -> tuple[KVPool, dict[int, torch.Tensor]]:
    spec = KVSpec(num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.bfloat16, block_size=4)
    pool = KVPool(spec, num_blocks=6, device=device)
    contents = {}
    for k in range(3):  # three sequences of two full blocks each, then released: six cached blocks
        tokens = list(range(10 * k + 3, 10 * k + 11))
        alloc = pool.blocks.allocate(f"s{k}", tokens)
        for block_id in alloc.block_ids:
            value = torch.randn(pool.block(block_id).shape, generator=torch.Generator().manual_seed(block_id))
            pool.block(block_id).copy_(value.to(spec.dtype))
            contents[block_id] = value.to(spec.dtype)
        pool.blocks.commit(f"s{k}", tokens)
        pool.blocks.free_sequence(f"s{k}")
    return pool, contents


def _check_resize(device: str, tmp_path: Path) -> None:
    pool, contents = _filled_pool(device)
    hashes = pool.blocks.cached_by_recency()
    old = {h: pool.blocks.cached[h].block_id for h in hashes}
    new = pool.resized(3, str(tmp_path))
    assert new.num_blocks == 3 and new.data.device.type == torch.device(device).type
    for h in hashes[-3:]:  # the three most recent survive, with their contents
        assert torch.equal(new.block(new.blocks.cached[h].block_id).cpu(), contents[old[h]])
    assert not any(h in new.blocks.cached for h in hashes[:-3])
    assert os.listdir(tmp_path) == []


def test_resize_keeps_the_most_recent_blocks(tmp_path: Path) -> None:
    _check_resize("cpu", tmp_path)


def test_a_resize_that_cannot_allocate_leaves_the_old_pool_intact(tmp_path: Path) -> None:
    pool, contents = _filled_pool("cpu")
    cached = dict(pool.blocks.cached)
    with pytest.raises(RuntimeError):
        pool.resized(1 << 60, str(tmp_path))  # 2^67 elements: torch refuses the size itself
    assert dict(pool.blocks.cached) == cached and pool.num_blocks == 6
    for block_id, value in contents.items():
        assert torch.equal(pool.block(block_id), value)
    assert os.listdir(tmp_path) == []


@pytest.mark.cuda
def test_resize_on_cuda_is_staged_through_the_host(tmp_path: Path) -> None:
    _check_resize("cuda", tmp_path)


@pytest.mark.cuda
def test_live_cuda_capture_matches_torch_counters() -> None:
    from memwarden.models import zoo
    from memwarden.record.cuda.capture import capture_cuda

    model = zoo.build_model("llava")
    inputs = zoo.make_inputs(model)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    with capture_cuda() as cap:
        model.to("cuda")
        with torch.no_grad():
            model(**{k: v.to("cuda") for k, v in inputs.items()})
    torch.cuda.synchronize()
    trace = cap.trace
    assert trace is not None
    gpu = trace.device_index("cuda:0")
    real_allocated = torch.cuda.max_memory_allocated()
    assert abs(summary(trace, device=gpu).peak_bytes - real_allocated) <= 0.01 * real_allocated
    assert peak_reserved_bytes(trace, gpu) == torch.cuda.max_memory_reserved()
    model.to("cpu")
