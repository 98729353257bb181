"""The session's first memory plan, as a pure function of sizes (in the style of ``plan.placement``).

Before a ``GovernedSession`` serves anything it decides three figures from numbers alone: the
smallest KV pool it must be able to hold (a request like ``example_inputs``, else
``min_kv_tokens``), the activation reserve kept free for a request's working memory, and whether
the weights must stream because weights, the first request's KV and its activations do not fit the
budget. :func:`plan_memory` takes those sizes and returns a frozen :class:`MemoryPlan`; the session
carries it out (``SessionMemory``: streaming the weights, sizing the pool). It touches no model and
no device, so it is tested with plain numbers (``tests/test_memory_plan.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MemoryPlan", "plan_memory"]


@dataclass(frozen=True)
class MemoryPlan:
    budget_bytes: int  # the budget the plan was made under
    min_pool_bytes: int  # the least KV pool the session must hold
    reserve_bytes: int  # activation memory kept free for a request
    stream: bool  # the weights stream (resident only what the budget leaves)
    needs_bytes: int  # weights + the first request's KV and activations + the learned margin


def plan_memory(
    *,
    budget_bytes: int,
    weights_bytes: int,
    page_size_bytes: int,
    block_size: int,
    min_kv_tokens: int,
    example_tokens: int = 0,
    reserve_bytes: int | None = None,
    example_reserve: Callable[[], int] = lambda: 0,
    learned_margin_bytes: int = 0,
    stream: bool | str = "auto",
) -> MemoryPlan:
    """The first plan under ``budget_bytes``.

    ``example_tokens``: the prompt and new tokens of ``example_inputs`` (0 without one): the pool must
    hold such a request. ``reserve_bytes``: the user's activation reserve (None: planned here, as the
    larger of a tenth of the budget and ``example_reserve()`` when there is an example).
    ``example_reserve``: the predicted activation bytes of a request like the example (else of a
    512-token prefill), called only when needed (it runs the peak predictor). ``stream``: True
    streams, False never does, ``"auto"`` streams when weights, the example's KV and its reserve
    do not fit the budget; a streamed session's reserve is at least ``example_reserve()``."""
    blocks = lambda tokens: -(-tokens // block_size)  # noqa: E731 -- ceil division in blocks
    min_tokens = max(min_kv_tokens, example_tokens) if example_tokens else min_kv_tokens
    min_pool = page_size_bytes * blocks(min_tokens)
    planned = example_reserve() if example_tokens and reserve_bytes is None else (reserve_bytes or 0)
    planned_kv = page_size_bytes * blocks(max(1, example_tokens))
    reserve = reserve_bytes if reserve_bytes is not None else max(budget_bytes // 10, planned)
    needs = weights_bytes + planned_kv + planned + learned_margin_bytes
    streams = stream is True or (stream == "auto" and needs > budget_bytes)
    if streams and reserve_bytes is None:  # room for a request like the example, or a 512-token prefill
        reserve = max(reserve, example_reserve())
    return MemoryPlan(
        budget_bytes=budget_bytes, min_pool_bytes=min_pool, reserve_bytes=reserve, stream=streams, needs_bytes=needs
    )
