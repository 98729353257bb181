"""One governing session per model: a second session takes the model over (or says to close the
first), close() restores the model exactly, and a roomy budget keeps the weights resident."""

from __future__ import annotations

import pytest
import torch

from memwarden.models import zoo
from memwarden.runtime.host_memory import state_bytes
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.session_config import SessionConfig
from memwarden.runtime.session_owner import GOVERNED, ModelGovernedError, governing_session

NEW = 6


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_two_sessions_one_after_the_other_both_serve_exactly(tmp_path):
    model = zoo.build_model("llava", "tiny")
    gk = zoo.generate_kwargs("llava")
    inputs = zoo.make_inputs(model, prompt_tokens=30)
    before = _weights(model)
    with torch.inference_mode():
        ref = model.generate(**inputs, max_new_tokens=NEW, **gk)
        # The first streams its weights (the case a second session used to fail on).
        first = GovernedSession(
            model, budget="64MiB", config=SessionConfig(stream=True, offload_dir=str(tmp_path / "a"))
        )
        assert first.streamer is not None and governing_session(model) is first
        assert torch.equal(first.generate(**inputs, max_new_tokens=NEW, **gk), ref)
        second = GovernedSession(
            model, budget="64MiB", config=SessionConfig(stream=True, offload_dir=str(tmp_path / "b"))
        )
        assert first.closed and governing_session(model) is second
        assert first.restored is not None and first.restored.weights_resident and first.restored.hooks_removed
        assert torch.equal(second.generate(**inputs, max_new_tokens=NEW, **gk), ref)
        with pytest.raises(RuntimeError, match="closed .*taken over"):
            first.generate(**inputs, max_new_tokens=NEW, **gk)
        restored = second.close()
        after = model.generate(**inputs, max_new_tokens=NEW, **gk)
    assert restored.weights_resident and restored.hooks_removed and restored.streamed_weights_restored
    assert restored.quantized_bits is None
    assert torch.equal(after, ref)
    now = model.state_dict()
    assert all(torch.equal(now[k], v) for k, v in before.items())  # exactly the weights it had
    assert governing_session(model) is None


def test_take_over_false_says_to_close_the_governing_session():
    model = zoo.build_model("llava", "tiny")
    first = GovernedSession(model, budget="64MiB")
    with pytest.raises(ModelGovernedError, match=GOVERNED):
        GovernedSession(model, budget="64MiB", config=SessionConfig(take_over=False))
    assert not first.closed and governing_session(model) is first
    first.close()
    with GovernedSession(
        model, budget="64MiB", config=SessionConfig(take_over=False)
    ) as again:  # closed: free to govern
        assert governing_session(model) is again


def test_close_reports_quantization_it_cannot_undo():
    model = zoo.build_model("llava", "tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=20)
    gk = zoo.generate_kwargs("llava")
    session = GovernedSession(model, budget="64MiB", config=SessionConfig(quantize=4, group_size=32))
    with torch.inference_mode():
        served = session.generate(**inputs, max_new_tokens=NEW, **gk)
        restored = session.close()
        plain = model.generate(**inputs, max_new_tokens=NEW, **gk)  # the model as close() left it
    assert restored.quantized_bits == 4 and restored.quantized_layers > 0
    assert "int4" in session.events[-1]["label"]
    assert torch.equal(served, plain)


def test_failed_session_does_not_govern_the_model():
    model = zoo.build_model("llava", "tiny")
    with pytest.raises(ValueError):
        GovernedSession(model, budget=1024, config=SessionConfig(stream=True))
    assert governing_session(model) is None
    with GovernedSession(model, budget="64MiB", config=SessionConfig(take_over=False)):
        pass


@pytest.mark.parametrize("name", zoo.NAMES)
@pytest.mark.parametrize("told", [False, True])
def test_budget_of_one_and_a_half_weights_keeps_them_resident(name, told):
    """Serving with or without an example of what it will serve: the reserve is planned from the
    requests it is asked to serve, so nothing is streamed for a worst case."""
    model = zoo.build_model(name, "small")
    gk = zoo.generate_kwargs(name)
    inputs = zoo.make_inputs(model, prompt_tokens=40)
    budget = int(1.5 * state_bytes(model))
    example = dict(inputs, max_new_tokens=NEW) if told else None
    with torch.inference_mode():
        ref = model.generate(**inputs, max_new_tokens=NEW, **gk)
        with GovernedSession(model, budget=budget, example_inputs=example) as session:
            assert session.streamer is None
            out = session.generate(**inputs, max_new_tokens=NEW, **gk)
            assert session.streamer is None and session.weights_bytes == state_bytes(model)
    assert torch.equal(out, ref)
    assert not any(e["kind"] == "stream" for e in session.events)
    tiny = zoo.build_model(name, "tiny")  # weights under 1 MiB: only the session's start is roomy there
    with GovernedSession(tiny, budget=int(1.5 * state_bytes(tiny))) as session:
        assert session.streamer is None
