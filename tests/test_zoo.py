"""The built-in model zoo: real transformers models with random weights, no mocks, no downloads."""

from __future__ import annotations

import pytest
import torch

from memwarden.errors import InputError
from memwarden.models import zoo

NEW_TOKENS = 3
VISION = [n for n in zoo.NAMES if zoo.spec(n).modality == "vision"]
FIXED_RESOLUTION = [n for n in VISION if not zoo.spec(n).dynamic_resolution]
DYNAMIC_RESOLUTION = [n for n in VISION if zoo.spec(n).dynamic_resolution]


@pytest.fixture(scope="module")
def tiny_models() -> dict[str, torch.nn.Module]:
    return {}


def tiny(models: dict[str, torch.nn.Module], name: str) -> torch.nn.Module:
    if name not in models:
        models[name] = zoo.build_model(name, "tiny")
    return models[name]


def generate(model: torch.nn.Module, name: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=NEW_TOKENS, **zoo.generate_kwargs(name))


def request_cases() -> list[tuple[str, dict]]:
    cases: list[tuple[str, dict]] = [(name, {}) for name in zoo.NAMES]
    cases += [(name, {"image_size": (168, 112)}) for name in DYNAMIC_RESOLUTION]  # (W, H), not square
    cases += [("qwen2-audio", {"audio_seconds": 0.5})]
    return cases


def test_required_names_and_default() -> None:
    assert {"llava", "qwen2-vl", "paligemma", "idefics3", "gemma3", "qwen2-audio"} <= set(zoo.NAMES)
    assert zoo.DEFAULT_DEPLOYMENT in zoo.NAMES
    for name in zoo.NAMES:
        s = zoo.spec(name)
        assert s.name == name
        assert s.family == zoo.build_config(name).model_type
        assert (s.native_image_size is None) == (s.modality == "audio")


@pytest.mark.parametrize(("name", "request_kw"), request_cases())
def test_generate_runs_exactly_max_new_tokens(tiny_models, name: str, request_kw: dict) -> None:
    model = tiny(tiny_models, name)
    prompt_tokens = 16
    inputs = zoo.make_inputs(model, prompt_tokens=prompt_tokens, **request_kw)
    n_media = zoo.placeholder_tokens(name, **request_kw)
    assert n_media > 0
    ids = inputs["input_ids"]
    assert ids.shape[1] == prompt_tokens + n_media
    assert int((ids == zoo.spec(name).placeholder_token_id).sum()) == n_media

    out = generate(model, name, inputs)
    assert out.shape == (1, ids.shape[1] + NEW_TOKENS)
    assert torch.equal(out[:, : ids.shape[1]], ids)


@pytest.mark.parametrize("name", zoo.NAMES)
def test_request_layout(name: str) -> None:
    s = zoo.spec(name)
    inputs = zoo.make_inputs(name, prompt_tokens=20, batch=2, seed=3)
    ids = inputs["input_ids"]
    assert ids.shape == (2, 20 + zoo.placeholder_tokens(name))
    assert torch.equal(inputs["attention_mask"], torch.ones_like(ids))
    vocab = zoo.build_config(name).get_text_config().vocab_size
    # the family's special tokens sit at the top of the vocabulary, from the lowest marker up
    lowest_special = min([s.placeholder_token_id] + [t for t in s.marker_token_ids if t > zoo.EOS_ID])
    for row in ids.tolist():
        markers = [t for t in row if t in s.marker_token_ids]
        assert set(markers) == set(s.marker_token_ids)
        text = [t for t in row if t not in s.marker_token_ids and t != s.placeholder_token_id]
        # prompt text never collides with pad/BOS/EOS or a family special token
        assert all(zoo.FIRST_TEXT_ID <= t < lowest_special < vocab for t in text)
        # the placeholders are one contiguous run
        first = row.index(s.placeholder_token_id)
        n = row.count(s.placeholder_token_id)
        assert row[first : first + n] == [s.placeholder_token_id] * n
    assert not torch.equal(ids[0], ids[1])  # rows carry different text
    for key in ("token_type_ids", "mm_token_type_ids"):
        if key in inputs:  # Gemma 3 and Qwen-VL mark the image tokens; PaliGemma's prefix is all 0
            expected = (ids == s.placeholder_token_id) if name != "paligemma" else torch.zeros_like(ids)
            assert torch.equal(inputs[key].bool(), expected.bool())


def test_batch_of_two_generates(tiny_models) -> None:
    name = "qwen2-vl"
    model = tiny(tiny_models, name)
    inputs = zoo.make_inputs(model, image_size=(56, 84), batch=2)
    assert inputs["image_grid_thw"].tolist() == [[1, 6, 4], [1, 6, 4]]  # (t, h, w) patches
    out = generate(model, name, inputs)
    assert out.shape == (2, inputs["input_ids"].shape[1] + NEW_TOKENS)


def test_make_inputs_is_deterministic_and_leaves_rng_alone() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = zoo.make_inputs("llava", seed=5)
    b = zoo.make_inputs("llava", seed=5)
    assert torch.equal(torch.rand(1), expected_next)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = zoo.make_inputs("llava", seed=6)
    assert not torch.equal(a["pixel_values"], c["pixel_values"])


def test_make_inputs_from_name_matches_model(tiny_models) -> None:
    from_name = zoo.make_inputs("gemma3", seed=1)
    from_model = zoo.make_inputs(tiny(tiny_models, "gemma3"), seed=1)
    assert from_name.keys() == from_model.keys()
    assert all(torch.equal(from_name[k], from_model[k]) for k in from_name)


@pytest.mark.parametrize("name", ["llava", "qwen2-audio", "gemma3"])
def test_same_seed_same_weights(name: str) -> None:
    torch.manual_seed(7)
    expected_next = torch.rand(1)
    torch.manual_seed(7)
    a = zoo.build_model(name, seed=0).state_dict()
    assert torch.equal(torch.rand(1), expected_next)  # the caller's RNG is untouched
    b = zoo.build_model(name, seed=0).state_dict()
    c = zoo.build_model(name, seed=1).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


def test_model_is_built_in_eval_mode_and_target_dtype() -> None:
    model = zoo.build_model("llava", dtype=torch.bfloat16)
    assert not model.training
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    out = generate(model, "llava", zoo.make_inputs(model))
    assert out.shape[1] == zoo.make_inputs(model)["input_ids"].shape[1] + NEW_TOKENS


def test_generate_kwargs_ignore_eos(tiny_models) -> None:
    """Even when the model's own EOS is the greedy token, generation runs every step."""
    name = "llava"
    model = tiny(tiny_models, name)
    inputs = zoo.make_inputs(model)
    with torch.no_grad():
        first = int(model(**inputs).logits[0, -1].argmax())
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = first
    try:
        out = generate(model, name, inputs)
    finally:
        model.generation_config.eos_token_id = saved
    assert out.shape[1] == inputs["input_ids"].shape[1] + NEW_TOKENS
    assert int(out[0, inputs["input_ids"].shape[1]]) == first
    kwargs = zoo.generate_kwargs(name)
    assert kwargs["do_sample"] is False and kwargs["eos_token_id"] is None and kwargs["pad_token_id"] is not None


def test_media_changes_the_output(tiny_models) -> None:
    for name in ("gemma3", "qwen2-audio"):  # Gemma 3 zero-initialises its projector; the zoo must not
        model = tiny(tiny_models, name)
        a = zoo.make_inputs(model, seed=0)
        key = "input_features" if name == "qwen2-audio" else "pixel_values"
        b = dict(a, **{key: a[key] * -1.0})
        with torch.no_grad():
            assert not torch.allclose(model(**a).logits[:, -1], model(**b).logits[:, -1])


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(zoo.UnknownModelError) as err:
        zoo.build_model("llava-9000")
    assert isinstance(err.value, InputError)
    for name in zoo.NAMES:
        assert name in str(err.value)
    for call in (zoo.spec, zoo.build_config, zoo.generate_kwargs, zoo.placeholder_tokens, zoo.make_inputs):
        with pytest.raises(zoo.UnknownModelError):
            call("nope")


def test_unknown_size() -> None:
    with pytest.raises(InputError, match="tiny"):
        zoo.build_config("llava", "huge")


@pytest.mark.parametrize("name", FIXED_RESOLUTION)
def test_non_native_size_is_refused(name: str) -> None:
    w, h = zoo.spec(name).native_image_size
    with pytest.raises(InputError, match=f"{w}x{h}"):
        zoo.make_inputs(name, image_size=(w * 2, h))
    with pytest.raises(InputError, match=f"{w}x{h}"):
        zoo.placeholder_tokens(name, image_size=(w, h + 1))


@pytest.mark.parametrize("name", DYNAMIC_RESOLUTION)
def test_dynamic_resolution_needs_merge_multiple(name: str) -> None:
    m = zoo.spec(name).image_multiple_px
    assert zoo.placeholder_tokens(name, image_size=(2 * m, 3 * m)) == 6
    with pytest.raises(InputError, match=str(m)):
        zoo.make_inputs(name, image_size=(2 * m + 1, m))


def test_request_errors() -> None:
    with pytest.raises(InputError, match="2 s"):
        zoo.make_inputs("qwen2-audio", audio_seconds=5.0)
    with pytest.raises(InputError, match="audio_seconds"):
        zoo.make_inputs("qwen2-audio", image_size=(32, 32))
    with pytest.raises(InputError, match="image_size"):
        zoo.make_inputs("llava", audio_seconds=1.0)
    with pytest.raises(InputError, match="prompt_tokens"):
        zoo.make_inputs("idefics3", prompt_tokens=2)
    with pytest.raises(InputError, match="batch"):
        zoo.make_inputs("llava", batch=0)


def test_audio_placeholders_follow_the_encoder() -> None:
    # Qwen2-Audio: mel frames -> conv stride 2 -> avg-pool 2
    assert zoo.placeholder_tokens("qwen2-audio", audio_seconds=1.0) == 25
    assert zoo.placeholder_tokens("qwen2-audio", audio_seconds=30.0, size="small") == 750
    assert zoo.placeholder_tokens("qwen2-audio", size="small") == 250


def test_small_native_requests() -> None:
    assert zoo.placeholder_tokens("llava", size="small") == 256
    assert zoo.spec("llava", "small").native_image_size == (224, 224)
    assert zoo.placeholder_tokens("qwen2-vl", size="small") == 256
    assert zoo.placeholder_tokens("idefics3", size="small") == 64


@pytest.mark.slow
def test_small_models_are_20_to_60m_parameters() -> None:
    for name in zoo.NAMES:
        model = zoo.build_model(name, "small")
        assert 20e6 <= zoo.parameter_count(model) <= 60e6, name
        del model


@pytest.mark.slow
def test_small_llava_generates() -> None:
    model = zoo.build_model("llava", "small")
    inputs = zoo.make_inputs(model)
    assert inputs["input_ids"].shape[1] == 16 + 256
    out = generate(model, "llava", inputs)
    assert out.shape[1] == inputs["input_ids"].shape[1] + NEW_TOKENS
