"""Reference measurements memwarden is checked against (tests and benchmarks use these)."""

from __future__ import annotations

from typing import Any

import torch


def profiler_peak_bytes(prof: Any) -> int:
    """Peak of PyTorch's own memory timeline (``prof._memory_profile().timeline`` of a
    ``torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)``):
    preexisting tensors plus creates minus destroys, at its highest."""
    from torch.profiler._memory_profiler import Action

    timeline = prof._memory_profile().timeline
    live = sum(size for _, action, _, size in timeline if action == Action.PREEXISTING)
    peak = live
    for _, action, _, size in timeline:
        if action == Action.CREATE:
            live += size
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return peak


def state_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers, each storage once (tied weights count once)."""
    storages = {}
    for t in list(model.parameters()) + list(model.buffers()):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())
