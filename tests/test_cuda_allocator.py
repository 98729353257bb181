"""The caching-allocator model against PyTorch's real CUDA caching allocator.

Marked `cuda`: skipped where no CUDA device is present (conftest). Replays recorded
alloc/free sequences on the real allocator and compares torch.cuda.max_memory_reserved()
with the model's prediction: exact for the default configuration. The second pair of tests
replays what the allocator's own memory history captured (``_record_memory_history``, turned
into a Trace by ``snapshot_to_trace``), with and without ``expandable_segments``; the latter
runs in a child process because the setting is read once, when CUDA initialises.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memwarden.interop.snapshot import load_snapshot
from memwarden.plan.replay import replay
from memwarden.trace.model import Action, TraceBuilder

MiB = 1 << 20


def sequences() -> list[tuple[str, list[tuple[str, int, int]]]]:
    """(name, [(op, tensor id, bytes)]) with op 'a' alloc / 'f' free."""
    out = []
    seq = [("a", i, 16 * MiB) for i in range(8)] + [("f", i, 16 * MiB) for i in range(8)]
    seq += [("a", 100 + i, 32 * MiB) for i in range(4)]
    out.append(("8x16MiB-then-4x32MiB", seq))
    seq = [("a", i, 32 * MiB) for i in range(4)] + [("f", i, 32 * MiB) for i in range(4)]
    seq += [("a", 100 + i, 16 * MiB) for i in range(8)]
    out.append(("4x32MiB-then-8x16MiB", seq))
    rng = random.Random(0)
    seq, live = [], []
    for i in range(400):  # mixed small/large pool, random lifetimes
        if live and rng.random() < 0.45:
            tid, size = live.pop(rng.randrange(len(live)))
            seq.append(("f", tid, size))
        else:
            size = rng.choice([rng.randint(1, 4096), rng.randint(4096, 1 << 20), rng.randint(1 << 20, 48 * MiB)])
            seq.append(("a", i, size))
            live.append((i, size))
    out.append(("random-mixed", seq))
    return out


@pytest.mark.cuda
@pytest.mark.parametrize(("name", "seq"), sequences())
def test_real_allocator_reserves_what_the_model_predicts(name: str, seq: list[tuple[str, int, int]]) -> None:
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() == 0, "other live CUDA tensors would share segments"
    torch.cuda.reset_peak_memory_stats()
    builder = TraceBuilder(devices=["cuda:0"])
    tensors = {}
    for t, (op, tid, size) in enumerate(seq):
        if op == "a":
            tensors[tid] = torch.empty(size, dtype=torch.uint8, device="cuda")
            builder.event(t, Action.ALLOC, tid, tensors[tid].data_ptr(), size, device="cuda:0")
        else:
            builder.event(t, Action.FREE, tid, tensors[tid].data_ptr(), size, device="cuda:0")
            del tensors[tid]
    torch.cuda.synchronize()
    real_reserved = torch.cuda.max_memory_reserved()
    tensors.clear()
    torch.cuda.empty_cache()
    predicted = replay(builder.build(), device=0)
    assert predicted.peak_reserved_bytes == real_reserved, name


def _run_captured(seq: list[tuple[str, int, int]], snapshot_path: str) -> int:
    """Run ``seq`` on the real allocator with its memory history on; write the history; peak reserved."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=100_000)
    tensors: dict[int, Any] = {}
    for op, tid, size in seq:
        if op == "a":
            tensors[tid] = torch.empty(size, dtype=torch.uint8, device="cuda")
        else:
            del tensors[tid]
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    real_reserved = torch.cuda.max_memory_reserved()
    tensors.clear()
    torch.cuda.empty_cache()
    Path(snapshot_path).write_bytes(pickle.dumps(snapshot))
    return real_reserved


@pytest.mark.cuda
@pytest.mark.parametrize("expandable", [False, True], ids=["default", "expandable_segments"])
@pytest.mark.parametrize(("name", "seq"), sequences())
def test_captured_cuda_trace_replays_to_the_real_reserved_bytes(
    name: str, seq: list[tuple[str, int, int]], expandable: bool, tmp_path: Path
) -> None:
    snapshot_path = str(tmp_path / "history.pickle")
    if expandable:  # PYTORCH_CUDA_ALLOC_CONF is read at CUDA init: a fresh process
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
        code = f"import test_cuda_allocator as t; t._child({name!r}, {snapshot_path!r})"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        real_reserved = json.loads(out.stdout.strip().splitlines()[-1])["max_memory_reserved"]
    else:
        real_reserved = _run_captured(seq, snapshot_path)
    trace = load_snapshot(snapshot_path)
    allocator = "pytorch-expandable" if expandable else "pytorch"
    predicted = replay(trace, device=trace.device_index("cuda:0"), allocator=allocator)
    assert predicted.peak_reserved_bytes == real_reserved, (name, allocator)


def _child(name: str, snapshot_path: str) -> None:
    seq = dict(sequences())[name]
    print(json.dumps({"max_memory_reserved": _run_captured(seq, snapshot_path)}))


def _synthetic_trace(seq: list[tuple[str, int, int]]) -> Any:
    builder = TraceBuilder(devices=["cuda:0"])
    for t, (op, tid, size) in enumerate(seq):
        builder.event(t, Action.ALLOC if op == "a" else Action.FREE, tid, 0x1000 * (tid + 1), size, device="cuda:0")
    return builder.build()


@pytest.mark.cuda
@pytest.mark.parametrize(("name", "seq"), sequences())
def test_under_a_memory_fraction_the_real_allocator_does_what_the_model_predicts(
    name: str, seq: list[tuple[str, int, int]]
) -> None:
    """``set_per_process_memory_fraction`` (the cap a GovernedSession sets on a GPU): the same reserve
    and, where live blocks fill the cap, the refusal at the same request."""
    import torch

    from memwarden.plan.allocator.config import AllocatorConfig

    free = replay(_synthetic_trace(seq), device=0)
    # Halfway between the allocated and the reserved peaks; an odd MiB so that the fraction's rounding
    # (allowed = fraction * total, truncated) never decides a tie (segments are whole 2 MiB units).
    cap = (free.peak_allocated_bytes + free.peak_reserved_bytes) // 2 // (2 * MiB) * (2 * MiB) + MiB
    model = replay(_synthetic_trace(seq), AllocatorConfig(limit_bytes=cap), device=0)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == 0, "other CUDA segments would count against the cap"
    torch.cuda.reset_peak_memory_stats()
    total = torch.cuda.get_device_properties(0).total_memory
    tensors: dict[int, Any] = {}
    refused_at = None
    torch.cuda.set_per_process_memory_fraction(cap / total)
    try:
        for t, (op, tid, size) in enumerate(seq):
            if op == "a":
                try:
                    tensors[tid] = torch.empty(size, dtype=torch.uint8, device="cuda")
                except torch.OutOfMemoryError:
                    refused_at = t
                    break
            else:
                del tensors[tid]
        torch.cuda.synchronize()
        real_reserved = torch.cuda.max_memory_reserved()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        tensors.clear()
        torch.cuda.empty_cache()
    assert refused_at == model.oom_at_event, name
    assert real_reserved == model.peak_reserved_bytes <= cap, name
