"""The budget as one value and the session's first plan as a pure function.

``Budget.parse`` is the only place a budget is read (bytes, a size string or a source); the session
carries the Budget to its memory, which asks it for the bytes in force under the process's real
limit -- never a "no limit" sentinel, never an attribute looked up before it exists. ``plan_memory``
decides the first pool, reserve and streaming from numbers alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import memwarden
from memwarden.govern.budget_value import Budget
from memwarden.models import zoo
from memwarden.runtime.host_memory import state_bytes
from memwarden.runtime.memory_plan import plan_memory
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.session_config import SessionConfig

MiB = 1 << 20
RUNTIME = Path(memwarden.__file__).resolve().parent / "runtime"


class _Source:
    def __init__(self, nbytes: int) -> None:
        self.budget_bytes = nbytes


def test_a_budget_is_bytes_a_source_or_both_and_never_nothing() -> None:
    assert Budget.parse("6GiB") == Budget(fixed_bytes=6 << 30)
    assert Budget.parse(1234).bytes_now() == 1234
    source = _Source(300 * MiB)
    capped = Budget.parse(source, cap="200MiB")
    assert capped.source is source and capped.bytes_now() == 200 * MiB  # the fixed figure caps the source
    source.budget_bytes = 100 * MiB
    assert capped.bytes_now() == 100 * MiB and capped.bytes_now(limit_bytes=64 * MiB) == 64 * MiB
    assert Budget.parse(capped) is capped
    assert capped.with_fixed("50MiB").bytes_now() == 50 * MiB and capped.fixed_bytes == 200 * MiB  # frozen
    with pytest.raises(TypeError, match="budget=None sets no limit"):
        Budget.parse(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="give the budget once"):
        Budget.parse("1GiB", cap="2GiB")
    with pytest.raises(TypeError):
        Budget()
    with pytest.raises((TypeError, ValueError)):
        Budget.parse([1, 2])  # type: ignore[arg-type]


def test_the_first_plan_from_numbers_alone() -> None:
    page, block = 64 * 1024, 16  # 64 KiB a block of 16 tokens
    calls: list[int] = []

    def reserve() -> int:
        calls.append(1)
        return 30 * MiB

    roomy = plan_memory(
        budget_bytes=1 << 30,
        weights_bytes=100 * MiB,
        page_size_bytes=page,
        block_size=block,
        min_kv_tokens=64,
        example_tokens=100,
        example_reserve=reserve,
    )
    assert roomy.min_pool_bytes == page * 7  # 100 tokens: 7 blocks, more than min_kv_tokens' 4
    assert roomy.reserve_bytes == (1 << 30) // 10 and not roomy.stream  # a tenth of the budget, above 30 MiB
    assert roomy.needs_bytes == 100 * MiB + page * 7 + 30 * MiB
    tight = plan_memory(
        budget_bytes=120 * MiB,
        weights_bytes=100 * MiB,
        page_size_bytes=page,
        block_size=block,
        min_kv_tokens=64,
        example_tokens=100,
        example_reserve=reserve,
    )
    assert tight.stream and tight.reserve_bytes == 30 * MiB  # weights + KV + activations > budget: stream
    never = plan_memory(
        budget_bytes=120 * MiB,
        weights_bytes=100 * MiB,
        page_size_bytes=page,
        block_size=block,
        min_kv_tokens=64,
        example_tokens=100,
        example_reserve=reserve,
        stream=False,
    )
    assert not never.stream
    given = plan_memory(
        budget_bytes=120 * MiB,
        weights_bytes=10 * MiB,
        page_size_bytes=page,
        block_size=block,
        min_kv_tokens=64,
        reserve_bytes=5 * MiB,
        example_reserve=reserve,
    )
    before = len(calls)
    assert given.reserve_bytes == 5 * MiB and given.min_pool_bytes == page * 4 and len(calls) == before
    # without an example the predictor is not asked (it runs a prediction)
    plan_memory(
        budget_bytes=1 << 30,
        weights_bytes=0,
        page_size_bytes=page,
        block_size=block,
        min_kv_tokens=64,
        example_reserve=reserve,
    )
    assert len(calls) == before


def test_the_budget_is_parsed_once_and_flows_as_one_value(monkeypatch: pytest.MonkeyPatch) -> None:
    model = zoo.build_model("llava", "tiny")
    parsed: list[object] = []
    original = Budget.parse.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Budget], budget: object, cap: object = None) -> Budget:
        parsed.append(budget)
        return original(cls, budget, cap)

    monkeypatch.setattr(Budget, "parse", classmethod(counting))
    budget = state_bytes(model) + 64 * MiB
    session = GovernedSession(model, budget, config=SessionConfig(encoder_cache=False))
    assert parsed == [budget]  # once, at the door
    assert session.memory.budget == Budget(fixed_bytes=budget)
    assert session.budget_bytes == min(budget, session.memory.limit_bytes or budget)
    session.set_budget(budget - MiB)
    assert session.memory.budget.fixed_bytes == budget - MiB and len(parsed) == 1
    session.close()
    # a telemetry source capped by config.budget: one Budget holding both
    source = _Source(4 * budget)
    capped = GovernedSession(model, source, config=SessionConfig(budget=budget, encoder_cache=False))
    assert capped.memory.budget.source is source and capped.memory.budget.fixed_bytes == budget
    assert capped.budget_bytes <= budget  # the fixed figure caps the source
    capped.close()


def test_the_runtime_has_no_no_limit_sentinel_and_no_late_attribute_lookup() -> None:
    for path in RUNTIME.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"2\s*\*\*\s*62|1\s*<<\s*62", text), path
        assert 'getattr(self, "limit_bytes"' not in text, path
    _ = torch  # the session above runs on torch
