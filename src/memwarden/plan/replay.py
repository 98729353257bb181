"""``replay(trace, allocator=...)``: one entry point over the allocator models.

``"pytorch"`` is PyTorch's caching allocator with ``config``, ``"pytorch-expandable"`` the same
with ``expandable_segments``, ``"arena"`` the static arena plan of ``memwarden.plan.arena``
(reserved is the arena size throughout).
"""

from __future__ import annotations

import dataclasses

from memwarden.plan.allocator.config import AllocatorConfig
from memwarden.plan.allocator.replay import replay_caching
from memwarden.plan.arena.replay import replay_arena
from memwarden.plan.records import ReplayResult
from memwarden.trace.model import Trace

__all__ = ["ALLOCATORS", "replay"]

ALLOCATORS: tuple[str, ...] = ("pytorch", "pytorch-expandable", "arena")


def replay(
    trace: Trace,
    config: AllocatorConfig | None = None,
    device: int = 0,
    *,
    allocator: str = "pytorch",
    history_columns: int = 0,
    arena_strategy: str = "best",
) -> ReplayResult:
    """Replay the ALLOC/PREEXISTING/FREE rows of ``device`` through ``allocator``.

    With ``history_columns > 0`` about that many evenly spaced layout columns are recorded for
    ``memwarden.report.heatmap``.
    """
    config = config or AllocatorConfig()
    if allocator not in ALLOCATORS:
        raise ValueError(f"unknown allocator {allocator!r} (valid: {', '.join(ALLOCATORS)})")
    if allocator == "arena":
        return replay_arena(trace, config, device, strategy=arena_strategy, history_columns=history_columns)
    if allocator == "pytorch-expandable" and not config.expandable_segments:
        config = dataclasses.replace(config, expandable_segments=True)
    return replay_caching(trace, config, device, history_columns=history_columns)
