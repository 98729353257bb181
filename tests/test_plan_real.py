"""The allocator model and the arena planner on real captured traces of the built-in models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import memwarden
import memwarden.plan.allocator.model
from memwarden.analyze.timeline import summary
from memwarden.models import zoo
from memwarden.plan.arena.plan import plan_arena
from memwarden.plan.replay import replay


@pytest.fixture(scope="module", params=zoo.NAMES)
def real_trace(request):
    model = zoo.build_model(request.param, size="tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=12)
    with memwarden.capture() as cap, torch.inference_mode():
        model.generate(**inputs, max_new_tokens=4, **zoo.generate_kwargs(request.param))
    return cap.trace


def test_best_arena_is_within_2_percent_of_the_lower_bound(real_trace) -> None:
    plan = plan_arena(real_trace, "best")
    assert plan.lower_bound_bytes <= plan.arena_bytes <= 1.02 * plan.lower_bound_bytes
    assert plan.arena_bytes < plan.naive_bytes
    # validity: no two tensors with overlapping lifetimes overlap in memory
    order = np.argsort(plan.first)
    first, last = plan.first[order], plan.last[order]
    lo, hi = plan.offsets[order], plan.offsets[order] + plan.sizes[order]
    for i in range(len(order)):
        live = (first <= last[i]) & (last >= first[i])
        live[i] = False
        assert not np.any(live & (lo < hi[i]) & (hi > lo[i]))


def test_replay_bounds_and_agrees_with_the_trace(real_trace) -> None:
    result = replay(real_trace)
    peak = summary(real_trace).anonymous_peak_bytes
    # allocated bytes are the trace's own bytes rounded up to 512 B blocks
    n_blocks = int(np.count_nonzero(real_trace.events["action"] != 1))
    assert peak <= result.peak_allocated_bytes <= peak + 512 * n_blocks
    assert result.peak_allocated_bytes <= result.peak_reserved_bytes
    assert 0.0 <= result.fragmentation < 1.0
    assert result.oom_at_event is None
    limited = replay(
        real_trace, memwarden.plan.allocator.model.AllocatorConfig(limit_bytes=result.peak_allocated_bytes // 2)
    )
    assert limited.oom_at_event is not None
