"""A session's cost on a GPU is the caching allocator's reserve: the cap that holds it to the budget,
and the repacking of resident weights once streamed ones have left their segments.

The cap is PyTorch's ``set_per_process_memory_fraction``: before a new segment would pass it the
allocator gives its cached blocks back, and refuses only when live blocks fill it. The model of
the allocator (``plan/allocator``) does the same (``tests/test_allocator.py`` checks the release and
the refusal; ``tests/test_cuda_allocator.py`` the real allocator against it under a cap on a GPU);
here it checks the room the session keeps for new segments.
The repacking runs here on CPU tensors (the same code, no allocator cache to empty).
"""

from __future__ import annotations

import pytest
import torch

from memwarden.plan.allocator.config import AllocatorConfig
from memwarden.plan.replay import replay
from memwarden.runtime.cuda_reserve import SEGMENT_ROOM_BYTES, reserve_fraction
from memwarden.runtime.offload_cuda import repack_resident
from memwarden.runtime.offload_plan import nan_placeholder
from memwarden.trace.model import Action, TraceBuilder

MiB = 1 << 20
GiB = 1 << 30


def test_the_fraction_is_what_others_hold_plus_the_budget() -> None:
    # 2 GiB allocated in the process, 1.5 GiB of it the session's: others hold 0.5 GiB.
    f = reserve_fraction(allocated=2 * GiB, held=3 * GiB // 2, budget=GiB, total=80 * GiB)
    assert int(f * 80 * GiB) == 3 * GiB // 2
    # A cap already in force is never loosened; nor is the fraction ever above 1.
    assert reserve_fraction(allocated=0, held=0, budget=GiB, total=80 * GiB, prior=0.01) == 0.01
    assert reserve_fraction(allocated=0, held=0, budget=100 * GiB, total=80 * GiB) == 1.0
    # The session's own count running ahead of the allocator's (rounding) leaves others at 0, not below.
    assert reserve_fraction(allocated=GiB, held=2 * GiB, budget=GiB, total=8 * GiB) == 1 / 8
    with pytest.raises(ValueError, match="no memory"):
        reserve_fraction(allocated=0, held=0, budget=1, total=0)


def _trace(ops: list[tuple[str, int, int]]) -> object:
    builder = TraceBuilder(devices=["cuda:0"])
    addr = {}
    for t, (op, tid, size) in enumerate(ops):
        addr.setdefault(tid, 0x1000 * (tid + 1))
        builder.event(t, Action.ALLOC if op == "a" else Action.FREE, tid, addr[tid], size, device="cuda:0")
    return builder.build()


def test_under_the_cap_live_blocks_that_fill_it_are_refused() -> None:
    """Where the live blocks alone pass the cap the allocator refuses (the session learns a margin
    from that refusal, as from any real limit): the cap never lets the reserve pass the budget."""
    ops = [("a", 0, 5 * MiB), ("a", 1, 5 * MiB), ("a", 2, 12 * MiB)]  # 5 MiB requests take 20 MiB segments
    capped = replay(_trace(ops), AllocatorConfig(limit_bytes=30 * MiB), device=0)  # type: ignore[arg-type]
    assert capped.oom_at_event == 2  # 20 MiB + 12 MiB > 30 MiB with 10 MiB live
    roomy = replay(_trace(ops), AllocatorConfig(limit_bytes=10 * MiB + 12 * MiB + SEGMENT_ROOM_BYTES), device=0)  # type: ignore[arg-type]
    assert roomy.oom_at_event is None  # the room the session keeps: one new segment of each pool


def test_repacking_keeps_parameters_ties_buffers_and_views() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 64))
    model[2].weight = model[0].weight  # tied, as a language model's head often is
    shared = torch.arange(8.0)
    model[1].register_buffer("scale", shared)
    model[2].register_buffer("scale", shared)  # one tensor, two modules
    model[0].register_buffer("view", torch.zeros(4, 4)[1])  # a view into a larger storage: stays
    model[1].register_buffer("alias", model[1].bias.detach())  # two tensors, one storage: both stay
    placeholder = nan_placeholder(torch.float32, (16, 16))
    model[1].weight.data = placeholder  # a streamed weight between uses: stays
    params = list(model.parameters())
    # The old storages are kept alive here, so that a new one can never get a freed one's address.
    before = {id(p): (p.detach().clone(), p.data) for p in params}
    view = model[0].view
    x = torch.randint(0, 64, (2, 5))
    bias = model[1].bias
    moved = repack_resident(model, torch.device("cpu"))
    assert list(model.parameters()) == params and all(a is b for a, b in zip(model.parameters(), params, strict=True))
    assert model[2].weight is model[0].weight  # still tied
    assert model[1].scale is model[2].scale  # still one buffer
    assert model[0].view is view  # the view was left alone
    assert model[1].weight.data_ptr() == placeholder.data_ptr()  # so was the placeholder
    for p in params:
        old, data = before[id(p)]
        assert p is model[1].weight or torch.equal(p.detach(), old)
        if p is not model[1].weight and p is not bias:
            assert p.untyped_storage().data_ptr() != data.untyped_storage().data_ptr()  # placed afresh
        else:
            assert p.untyped_storage().data_ptr() == data.untyped_storage().data_ptr()  # left where it was
    assert model[1].alias.data_ptr() == bias.data_ptr()  # the alias still reads the bias
    assert moved == model[0].weight.nbytes + model[2].bias.nbytes + shared.nbytes
    assert model(x).shape == (2, 5, 64)
