"""The caching-allocator model against PyTorch's real CUDA caching allocator.

Marked `cuda`: skipped where no CUDA device is present (conftest). Replays recorded
alloc/free sequences on the real allocator and compares torch.cuda.max_memory_reserved()
with the model's prediction: exact for the default configuration.
"""

from __future__ import annotations

import random

import pytest

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
