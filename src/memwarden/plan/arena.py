"""Static arena planning: give every tensor of a trace a fixed offset in one buffer.

If the whole allocation sequence is known in advance (an exported graph, a
fixed-shape inference step), tensors whose lifetimes never overlap can share
memory, and one arena replaces the caching allocator. The strategies are the
offset-calculation heuristics of Pisarchyk & Lee, "Efficient Memory Management
for Deep Neural Net Inference" (arXiv 2001.03288), as implemented in TFLite's
GPU delegate (``tensorflow/lite/delegates/gpu/common/memory_management/``):

- ``greedy-by-size``: records by non-increasing size; each goes into the
  smallest gap between placed records whose lifetimes intersect its own, else
  right after the highest of them.
- ``greedy-by-breadth``: time steps by non-increasing breadth (live bytes); the
  tensors of each step by non-increasing size; the same placement rule.
- ``best``: runs both and keeps the smaller arena, skipping the second when the first
  already reaches the lower bound (ExecuTorch's planner suite keeps the best of several too).

Lifetimes are inclusive trace-row intervals ``[first, last]``: PREEXISTING
counts from row 0, a tensor never freed lives to the last row.

Layout: ``Lifetimes``, ``ArenaPlan``, ``plan_arena`` and the strategies' orders in
``memwarden.plan.arena_plan``; the overlap index and its packed spans in
``memwarden.plan.arena_index`` (whose docstring explains what planning costs);
``replay_arena`` in ``memwarden.plan.arena_replay``. All are re-exported here, so
``memwarden.plan.arena`` stays the one import for callers.
"""

from __future__ import annotations

# Tests also import the span helpers, _OverlapIndex and _size_order from here.
from memwarden.plan.arena_index import _add_span as _add_span
from memwarden.plan.arena_index import _best_gap as _best_gap
from memwarden.plan.arena_index import _OverlapIndex as _OverlapIndex
from memwarden.plan.arena_index import _pack as _pack
from memwarden.plan.arena_plan import DEFAULT_ALIGNMENT as DEFAULT_ALIGNMENT
from memwarden.plan.arena_plan import STRATEGIES, ArenaPlan, Lifetimes, lifetimes, plan_arena
from memwarden.plan.arena_plan import _size_order as _size_order
from memwarden.plan.arena_replay import replay_arena

__all__ = ["STRATEGIES", "ArenaPlan", "Lifetimes", "lifetimes", "plan_arena", "replay_arena"]
