"""GovernedSession on real zoo models: same greedy tokens as model.generate, prefix reuse,
encoder cache, admission, and the budget measured by PyTorch's memory profiler."""

from __future__ import annotations

import pytest
import torch

from memwarden.models import zoo
from memwarden.record.live.reference import profiler_peak_bytes
from memwarden.runtime.admission import AdmissionError
from memwarden.runtime.host_memory import state_bytes
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.session_config import SessionConfig
from memwarden.runtime.session_owned import BudgetError

NEW = 8


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {name: zoo.build_model(name, "tiny") for name in ("llava", "qwen2-audio", "idefics3", "gemma3")}


def _media(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}


def _chat_turns(model: torch.nn.Module, n: int = 3, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    first = zoo.make_inputs(model, prompt_tokens=30, seed=seed)
    return [first] + [{"input_ids": torch.randint(3, 200, (1, 9), generator=g)} for _ in range(n - 1)]


def _reference_chat(model, name, turns):
    """Plain transformers chat loop: the whole conversation and the image resent each turn."""
    gk = zoo.generate_kwargs(name)
    media = _media(turns[0])
    seq_len = turns[0]["input_ids"].shape[1]
    history = None
    replies = []
    for t in turns:
        history = t["input_ids"] if history is None else torch.cat([history, t["input_ids"]], 1)
        per_token = {
            k: torch.nn.functional.pad(v, (0, history.shape[1] - v.shape[1]))
            for k, v in media.items()
            if v.dim() == 2 and v.shape[1] == seq_len and k.endswith("type_ids")
        }
        other = {k: v for k, v in media.items() if k not in per_token}
        out = model.generate(
            input_ids=history, attention_mask=torch.ones_like(history), max_new_tokens=NEW, **other, **per_token, **gk
        )
        replies.append(out[:, history.shape[1] :])
        history = torch.cat([history, replies[-1]], 1)
    return replies


@pytest.mark.parametrize("name", ["llava", "qwen2-audio", "idefics3"])
@pytest.mark.parametrize("reuse", [True, False])
def test_generate_equals_model_generate(models, name, reuse):
    model = models[name]
    gk = zoo.generate_kwargs(name)
    inputs = zoo.make_inputs(model, prompt_tokens=40)
    with torch.inference_mode():
        ref = model.generate(**inputs, max_new_tokens=NEW, **gk)
        with GovernedSession(model, budget="1GiB", config=SessionConfig(prefix_reuse=reuse)) as session:
            first = session.generate(**inputs, max_new_tokens=NEW, **gk)
            again = session.generate(**inputs, max_new_tokens=NEW, **gk)
    assert torch.equal(first, ref)
    assert torch.equal(again, ref)
    second = session.records[1]
    if reuse:  # the repeated request found its image's blocks: nothing of the image recomputed
        assert second.reused_tokens >= inputs["input_ids"].shape[1] - session.spec.block_size
        assert not second.media_reencoded
    else:
        assert second.reused_tokens == 0 and second.media_reencoded


@pytest.mark.parametrize("name", ["llava", "qwen2-audio", "gemma3"])
@pytest.mark.parametrize("reuse", [True, False])
def test_chat_equals_plain_chat_loop(models, name, reuse):
    model = models[name]
    gk = zoo.generate_kwargs(name)
    turns = _chat_turns(model)
    with torch.inference_mode():
        ref = _reference_chat(model, name, turns)
        session = GovernedSession(model, budget="1GiB", config=SessionConfig(prefix_reuse=reuse))
        replies = [session.chat(t["input_ids"], max_new_tokens=NEW, **_media(t), **gk) for t in turns]
    for got, want in zip(replies, ref, strict=True):
        assert torch.equal(got, want)
    later = session.records[1:]
    if reuse:  # turns 2+ prefill only what is new: less than one block plus the new message and reply
        for rec in later:
            assert rec.prompt_tokens - rec.reused_tokens < session.spec.block_size + 9 + NEW
            assert not rec.media_reencoded
    else:
        assert all(rec.reused_tokens == 0 for rec in later)


def _after(model, a, b):
    """A session serves request ``a`` then ``b``; (session, b's output, plain generate's for b)."""
    gk = zoo.generate_kwargs("llava")
    with torch.inference_mode():
        ref_b = model.generate(**b, max_new_tokens=NEW, **gk)
        session = GovernedSession(model, budget="1GiB")
        session.generate(**a, max_new_tokens=NEW, **gk)
        return session, session.generate(**b, max_new_tokens=NEW, **gk), ref_b


def test_new_image_is_not_served_from_the_old_one(models):
    model = models["llava"]
    a = zoo.make_inputs(model, prompt_tokens=40, seed=0)
    b = dict(a, pixel_values=a["pixel_values"].flip(-1))  # same tokens, another picture
    session, out_b, ref_b = _after(model, a, b)
    assert torch.equal(out_b, ref_b)
    rec = session.records[1]
    assert rec.media_reencoded
    image_start = int((a["input_ids"][0] == model.config.image_token_index).nonzero()[0])
    assert rec.reused_tokens <= image_start  # nothing at or after the image was reused


def test_encoder_cache_serves_the_same_image_after_another_prefix(models):
    model = models["llava"]
    a = zoo.make_inputs(model, prompt_tokens=40, seed=0)
    ids = a["input_ids"].clone()
    ids[0, 0] = 7  # another first token: no block of the prefix matches, the image is the same
    session, out_b, ref_b = _after(model, a, dict(a, input_ids=ids))
    assert torch.equal(out_b, ref_b)
    assert session.records[1].reused_tokens == 0
    assert session.encoder_cache is not None
    assert (session.encoder_cache.hits, session.encoder_cache.misses) == (1, 1)


def _profiled_peak(fn) -> int:
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        fn()
    return profiler_peak_bytes(prof)


def test_profiler_peak_stays_under_the_budget_and_the_prediction(models):
    model = models["llava"]
    gk = zoo.generate_kwargs("llava")
    weights = state_bytes(model)
    budget = weights + 1024**2
    turns = _chat_turns(model, n=2)
    with torch.inference_mode():
        session = GovernedSession(model, budget=budget)
        assert session.predict(**turns[0], max_new_tokens=NEW) <= budget  # calibrates, outside the measurement
        peaks = [
            _profiled_peak(lambda t=t: session.chat(t["input_ids"], max_new_tokens=NEW, **_media(t), **gk))
            for t in turns
        ]
    assert all(p > weights for p in peaks)  # the measurement sees the weights and the pool
    for peak, rec in zip(peaks, session.records, strict=True):
        assert peak <= budget
        assert peak <= rec.decision.predicted_peak_bytes
        assert rec.decision.action == "admit"


def test_budget_too_small_for_the_weights_is_one_clear_error(models):
    with pytest.raises(BudgetError, match="does not hold the weights"):
        GovernedSession(models["llava"], budget=1024)


def test_request_longer_than_the_pool_is_refused_before_running(models):
    model = models["llava"]
    inputs = zoo.make_inputs(model, prompt_tokens=40)
    session = GovernedSession(model, budget="1GiB", config=SessionConfig(num_kv_blocks=2))
    with pytest.raises(AdmissionError, match="tokens of KV cache"):
        session.generate(**inputs, max_new_tokens=NEW, **zoo.generate_kwargs("llava"))
    assert session.pool.blocks.num_free_blocks == 2  # nothing leaked


def test_weights_twice_the_budget_are_streamed_and_outputs_stay_exact(tmp_path):
    model = zoo.build_model("llava", "small")
    gk = zoo.generate_kwargs("llava")
    weights = state_bytes(model)
    budget = weights // 2
    turns = _chat_turns(model, n=2)
    with torch.inference_mode():
        ref = _reference_chat(model, "llava", turns)
        session = GovernedSession(
            model,
            budget=budget,
            example_inputs=dict(turns[0], max_new_tokens=NEW),
            config=SessionConfig(offload_dir=str(tmp_path), min_kv_tokens=256),
        )
        assert session.streamer is not None and session.weights_bytes < budget
        session.predict(**turns[0], max_new_tokens=NEW)  # calibrates, outside the measurement
        replies, peaks = [], []
        for t in turns:
            peaks.append(
                _profiled_peak(
                    lambda t=t: replies.append(session.chat(t["input_ids"], max_new_tokens=NEW, **_media(t), **gk))
                )
            )
        session.close()  # weights come back
        after = model.generate(**turns[0], max_new_tokens=NEW, **gk)
    for got, want in zip(replies, ref, strict=True):
        assert torch.equal(got, want)
    assert max(peaks) <= budget
    assert session.records[1].reused_tokens > 0
    assert torch.equal(after[:, turns[0]["input_ids"].shape[1] :], ref[0])
