"""Long generations at the cost of a short one: the extrapolated card of every zoo model equals the
card of a run that makes every decode step; steps that are not steady are run."""

from __future__ import annotations

import pytest

from memwarden.estimation import measure
from memwarden.estimation import run as est
from memwarden.estimation.build import card_from_trace
from memwarden.estimation.resolve import resolve_model
from memwarden.models import zoo


def _media(name: str) -> dict:
    sp = zoo.spec(name)
    if sp.modality == "audio":
        return {"audio_seconds": 1.0}
    return {"images": [(56, 56)] if sp.dynamic_resolution else [sp.native_image_size]}


# gemma3's sliding window (64 tokens in the tiny config) fills at step ~36: its steps are steady after that
NEW_TOKENS = {name: 100 if name == "gemma3" else 40 for name in zoo.NAMES}


@pytest.mark.parametrize("name", zoo.NAMES)
def test_extrapolated_card_equals_the_step_by_step_run(name: str) -> None:
    card = est.estimate(name, prompt_tokens=12, new_tokens=NEW_TOKENS[name], dtype="float32", **_media(name))
    assert card.generation["extrapolated"] and card.generation["steps_run"] < NEW_TOKENS[name] // 2
    assert card.request is not None
    trace, _ = measure.run_estimate(resolve_model(name), card.request)
    full = card_from_trace(trace, model=name, request=card.request)
    assert full.generation == {"new_tokens": NEW_TOKENS[name], "steps_run": NEW_TOKENS[name], "extrapolated": False}
    assert card.peak_bytes == full.peak_bytes
    assert card.kv_cache_bytes == full.kv_cache_bytes
    assert card.phases == full.phases  # every phase's peak and what it is made of, decode included
    assert card.by_category_at_peak == full.by_category_at_peak
    assert card.by_modality_at_peak == full.by_modality_at_peak


def test_long_generation_runs_few_steps_and_grows_the_cache_per_token() -> None:
    cards = {n: est.estimate("llava", prompt_tokens=12, new_tokens=n, dtype="float32") for n in (40, 1000)}
    assert cards[1000].generation == {"new_tokens": 1000, "steps_run": 6, "extrapolated": True}
    text = resolve_model("llava").config.get_text_config()
    per_token = (
        2 * text.num_hidden_layers * text.num_key_value_heads * (text.hidden_size // text.num_attention_heads) * 4
    )
    assert cards[1000].kv_cache_bytes - cards[40].kv_cache_bytes == 960 * per_token
    assert cards[1000].phases["decode"]["peak_bytes"] > cards[40].phases["decode"]["peak_bytes"]


def test_a_quantized_cache_runs_every_step() -> None:
    card = est.estimate("llava", prompt_tokens=12, new_tokens=20, dtype="float32", kv_dtype="int8")
    assert card.generation == {"new_tokens": 20, "steps_run": 20, "extrapolated": False}
