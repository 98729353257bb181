"""GovernedSession by composition: its knobs are one SessionConfig, and an admission step answers
with a value (admit, change the plan, wait, refuse) that the serving loop acts on. Real tiny zoo
models throughout; the fallback is served through its own public generate()."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from memwarden.models import zoo
from memwarden.runtime.admission import AdmissionError
from memwarden.runtime.host_memory import state_bytes
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.session_config import SessionConfig

NEW = 8
GEN = zoo.generate_kwargs("llava")


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return zoo.build_model("llava", "tiny")


def _text_request(tokens: int = 20) -> dict[str, torch.Tensor]:
    """A text-only llava request: no image token (1023 in the tiny config), so no quality rung applies."""
    return {"input_ids": torch.randint(3, 200, (1, tokens), generator=torch.Generator().manual_seed(3))}


def _tight_session(model: torch.nn.Module, inputs: dict[str, torch.Tensor], **kwargs) -> GovernedSession:
    """A session whose pool holds exactly the request (no spare blocks to give back) and that may not stream."""
    blocks = -(-(inputs["input_ids"].shape[1] + NEW) // 16)
    config = SessionConfig(num_kv_blocks=blocks, stream=False, encoder_cache=False)
    return GovernedSession(model, "1GiB", config=config, **kwargs)


def test_the_config_carries_the_knobs_and_the_budget_argument_the_budget(model):
    weights = state_bytes(model)
    budget = weights + 64 * 2**20
    knobs = {"kv_fraction": 0.25, "max_wait_s": 1.0, "encoder_cache": False, "block_size": 8, "min_kv_tokens": 256}
    session = GovernedSession(model, budget, config=SessionConfig(**knobs))
    assert session.config == SessionConfig(budget=budget, **knobs)
    assert session.spec.block_size == 8 and session.encoder_cache is None
    again = GovernedSession(model, budget, config=session.config)  # a session's config builds the same session
    assert again.config == session.config and again.pool.num_blocks == session.pool.num_blocks
    assert SessionConfig().budget is None and SessionConfig().heap_mmap_threshold == 128 * 1024


def test_two_budgets_are_refused(model):
    config = SessionConfig(budget="1GiB", kv_fraction=0.25)
    with pytest.raises(TypeError, match="give the budget once"):
        GovernedSession(model, "2GiB", config=config)
    assert GovernedSession(model, 2**30, config=config).config.budget == 2**30  # "1GiB" and 2**30 agree
    with pytest.raises(TypeError, match="budget=None sets no limit"):
        GovernedSession(model, None)  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.kv_fraction = 0.5  # type: ignore[misc]


def test_admission_step_admits_what_fits(model):
    session = GovernedSession(model, budget="1GiB")
    inputs = zoo.make_inputs(model, prompt_tokens=24)
    decision = session.admission_step(**inputs, max_new_tokens=NEW)
    assert decision.kind == "admit" and decision.record is not None
    assert decision.record.action == "admit" and decision.record.changes == []
    assert decision.predicted_peak_bytes is not None and decision.predicted_peak_bytes <= decision.budget_bytes
    assert session.records == [] and session.events == []  # a step changes nothing


def test_admission_step_refuses_a_budget_below_the_weights_with_the_reason(model):
    inputs = _text_request()
    session = _tight_session(model, inputs)
    session.set_budget(state_bytes(model) // 2)
    decision = session.admission_step(**inputs, max_new_tokens=NEW)
    assert decision.kind == "refuse" and "exceeds the budget" in decision.reason
    with pytest.raises(AdmissionError, match="exceeds the budget"):  # the loop raises what the step said
        session.generate(**inputs, max_new_tokens=NEW, **GEN)
    assert session.records == []


def test_admission_step_refuses_a_request_longer_than_a_fixed_pool(model):
    session = GovernedSession(model, "1GiB", config=SessionConfig(num_kv_blocks=1))
    decision = session.admission_step(**_text_request(40), max_new_tokens=NEW)
    assert decision.kind == "refuse" and decision.predicted_peak_bytes is None
    assert "48 tokens of KV cache, the pool holds 16" in decision.reason


def test_admission_step_waits_while_a_squeeze_may_end(model):
    inputs = _text_request()
    session = _tight_session(model, inputs)
    session.set_budget(state_bytes(model) // 2, temporary=True)  # a squeeze: the budget may come back
    decision = session.admission_step(**inputs, max_new_tokens=NEW)
    assert decision.kind == "wait" and decision.wait_s > 0 and "budget may rise" in decision.reason


def test_a_budget_that_needs_pruning_changes_the_plan_and_is_served_at_that_rung(model):
    inputs = zoo.make_inputs(model, prompt_tokens=24)
    session = _tight_session(model, inputs)
    assert session.ladder.rungs[0] == ("prune", 0.5)
    full = session.admission.predict(session._plan(inputs["input_ids"], dict(inputs), rung=0), NEW)
    pruned = session.admission.predict(session._plan(inputs["input_ids"], dict(inputs), rung=1), NEW)
    assert pruned < full  # half the image's tokens fewer
    # A budget whose admissible part (the budget less its safety margin) lies between the two predictions.
    mid = (full + pruned) // 2
    budget = mid
    while session.memory.admissible(budget) < mid:
        budget += 4096
    assert pruned <= session.memory.admissible(budget) < full
    session.set_budget(budget)
    decision = session.admission_step(**inputs, max_new_tokens=NEW)
    assert (decision.kind, decision.change, decision.rung, decision.label) == ("change", "rung", 1, "prune 0.5")
    out = session.generate(**inputs, max_new_tokens=NEW, **GEN)
    record = session.records[-1]
    assert record.rung == 1 and record.decision.action == "degrade" and record.decision.changes == ["prune 0.5"]
    image_tokens = int((inputs["input_ids"] == model.config.image_token_index).sum())
    assert record.prompt_tokens == inputs["input_ids"].shape[1] - image_tokens // 2
    # generate()'s contract holds for a pruned request too: the caller's prompt, then the new tokens
    assert out.shape[1] == inputs["input_ids"].shape[1] + NEW and record.new_tokens == NEW
    assert torch.equal(out[:, : inputs["input_ids"].shape[1]], inputs["input_ids"])
    assert any(e["kind"] == "degrade" and e["label"] == "prune 0.5" for e in session.events)


def test_fallback_is_served_through_its_public_generate(model):
    small = zoo.build_model("llava", "tiny")
    fallback = GovernedSession(small, budget="1GiB")
    inputs = _text_request()
    session = _tight_session(model, inputs, fallback=fallback)
    session.set_budget(state_bytes(model) // 2)
    decision = session.admission_step(**inputs, max_new_tokens=NEW)
    assert (decision.kind, decision.change) == ("change", "fallback")
    calls = []
    public_generate = fallback.generate
    fallback.generate = lambda *a, **k: (
        calls.append(k.get("max_new_tokens", a[1] if len(a) > 1 else None)) or (public_generate(*a, **k))
    )
    with torch.inference_mode():
        out = session.generate(**inputs, max_new_tokens=NEW, **GEN)
        want = small.generate(**inputs, max_new_tokens=NEW, **GEN)
    assert calls == [NEW]  # the public, locked entry point, once
    assert torch.equal(out, want)
    assert session.records == [] and len(fallback.records) == 1  # the fallback served and recorded it
    served = [e for e in session.events if e["label"] == "served by the fallback model"]
    assert len(served) == 1 and served[0]["reason"] == "fallback model"
