"""Visual-token pruning (runtime/prune.py) on the tiny zoo models."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from memwarden.analyze.timeline import summary
from memwarden.errors import InputError
from memwarden.models import zoo
from memwarden.record.live.capture import Capture
from memwarden.runtime.prune import (
    METHODS,
    PruningUnsupportedError,
    VisualTokenPruner,
    kept_count,
    unsupported_reason,
)

SUPPORTED = ("llava", "paligemma", "gemma3", "idefics3")


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {name: zoo.build_model(name) for name in SUPPORTED}


def _generate(model: torch.nn.Module, name: str, inputs: dict, new_tokens: int = 4) -> torch.Tensor:
    return model.generate(**inputs, max_new_tokens=new_tokens, **zoo.generate_kwargs(name))


def _visual(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return ids == VisualTokenPruner(model).image_token_id


@pytest.mark.parametrize("name", SUPPORTED)
def test_keep_all_is_the_unpruned_request(models, name):
    model = models[name]
    inputs = zoo.make_inputs(model, prompt_tokens=10, seed=3)
    pruner = VisualTokenPruner(model)
    request = pruner.prune(inputs, 1.0, method="fastv")
    assert request.is_identity and request.removed_tokens == 0
    assert all(request.inputs[k] is v for k, v in inputs.items())
    with pruner.applied(request):
        assert "get_image_features" not in vars(model.model)  # nothing installed
        out = _generate(model, name, request.inputs)
    assert torch.equal(out, _generate(model, name, inputs))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", SUPPORTED)
def test_half_pruned_request_is_consistent_and_generates(models, name, method):
    model = models[name]
    inputs = zoo.make_inputs(model, prompt_tokens=10, batch=2, seed=1)
    pruner = VisualTokenPruner(model)
    request = pruner.prune(inputs, 0.5, method=method)

    n = int(_visual(model, inputs["input_ids"])[0].sum())
    kept = kept_count(n, 0.5)
    assert request.num_visual_tokens == n and request.removed_tokens == n - kept
    ids = request.inputs["input_ids"]
    assert ids.shape == (2, inputs["input_ids"].shape[1] - (n - kept))
    assert (_visual(model, ids).sum(dim=1) == kept).all()
    # every non-visual token survives, in order
    old = inputs["input_ids"]
    assert torch.equal(ids[~_visual(model, ids)].view(2, -1), old[~_visual(model, old)].view(2, -1))
    for name_t in ("attention_mask", "token_type_ids"):
        if name_t in inputs:
            assert request.inputs[name_t].shape == ids.shape
    if name == "gemma3":  # 1 exactly on the image soft tokens, as its processor makes them
        assert torch.equal(request.inputs["token_type_ids"], _visual(model, ids).long())
    for k in request.kept:
        assert k.dtype == torch.long and torch.all(k[1:] > k[:-1]) and len(k) == kept

    with pruner.applied(request):
        out = _generate(model, name, request.inputs, new_tokens=3)
    assert out.shape == (2, ids.shape[1] + 3)
    assert "get_image_features" not in vars(model.model)  # the wrapper is gone


@pytest.mark.parametrize("name", ["llava", "gemma3"])
def test_scored_features_equal_a_fresh_encode_then_select(models, name):
    """The features kept from scoring (served without encoding again) are the ones the model's own
    image path gives for the same pixels, selected: a copy of the pixels takes the re-encode path."""
    model = models[name]
    inputs = zoo.make_inputs(model, prompt_tokens=10, seed=5)
    pruner = VisualTokenPruner(model)
    request = pruner.prune(inputs, 0.5, method="summary")
    with pruner.applied(request):
        served = _generate(model, name, request.inputs)
        copied = dict(request.inputs, pixel_values=inputs["pixel_values"].clone())
        encoded_again = _generate(model, name, copied)
    assert torch.equal(served, encoded_again)


def test_summary_keeps_the_most_similar_and_diverse_the_least(models):
    model = models["llava"]
    inputs = zoo.make_inputs(model, prompt_tokens=10, seed=2)
    pruner = VisualTokenPruner(model)
    summary_req = pruner.prune(inputs, 0.5, method="summary")
    diverse_req = pruner.prune(inputs, 0.5, method="diverse")
    (scores,) = summary_req.scores
    (kept,) = summary_req.kept
    dropped = torch.ones(len(scores), dtype=torch.bool).index_fill_(0, kept, False)
    assert scores[kept].min() >= scores[dropped].max()
    assert set(kept.tolist()).isdisjoint(diverse_req.kept[0].tolist())  # 16 tokens, 8 each, no ties


@pytest.mark.parametrize("name", ["llava", "gemma3"])
def test_fastv_scores_equal_eager_attention(name):
    """The scorer's own q.k at layer K equals the attention probabilities eager attention returns,
    averaged over heads and the text tokens after the image."""
    model = zoo.build_model(name)
    inputs = zoo.make_inputs(model, prompt_tokens=12, seed=4)
    pruner = VisualTokenPruner(model, fastv_layer=1)
    request = pruner.prune(inputs, 0.5, method="fastv")

    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
    probs = out.attentions[1][0]  # (heads, T, T) of layer 1, row 0
    is_visual = _visual(model, inputs["input_ids"])[0]
    last_visual = int(torch.nonzero(is_visual).max())
    expected = probs[:, last_visual + 1 :, :].mean(dim=(0, 1))[is_visual]
    torch.testing.assert_close(request.scores[0], expected.float(), rtol=1e-4, atol=1e-6)
    assert 0 < float(request.scores[0].sum()) <= 1 + 1e-5


def test_half_pruned_prefill_peak_is_lower(models):
    """Measured: the whole pruned request (scoring included) peaks below the unpruned one, and so
    does its prefill."""
    name = "llava"
    model = models[name]
    inputs = zoo.make_inputs(model, prompt_tokens=8, seed=1)
    pruner = VisualTokenPruner(model)
    with Capture() as cap:
        _generate(model, name, inputs, new_tokens=1)
    full = summary(cap.trace)
    for method in ("summary", "fastv"):
        with Capture() as cap:
            request = pruner.prune(inputs, 0.5, method=method)
            with pruner.applied(request):
                _generate(model, name, request.inputs, new_tokens=1)
        pruned = summary(cap.trace)
        assert pruned.peak_bytes < full.peak_bytes, method
        assert pruned.by_phase_peak["prefill"] < full.by_phase_peak["prefill"], method


@pytest.mark.parametrize("ratio", [0, 0.0, -0.25, 1.5, math.nan, math.inf, "0.5", None, True])
def test_bad_ratios_are_refused(models, ratio):
    model = models["llava"]
    with pytest.raises(InputError, match="keep_ratio"):
        VisualTokenPruner(model).prune(zoo.make_inputs(model), ratio)


def test_bad_method_and_requests_are_refused(models):
    model = models["llava"]
    pruner = VisualTokenPruner(model)
    inputs = zoo.make_inputs(model)
    with pytest.raises(InputError, match="unknown pruning method"):
        pruner.prune(inputs, 0.5, method="magic")
    with pytest.raises(InputError, match="input_ids"):
        pruner.prune({"pixel_values": inputs["pixel_values"]}, 0.5)
    with pytest.raises(InputError, match="fastv_layer"):
        VisualTokenPruner(model, fastv_layer=-1)


def test_text_only_request_is_left_alone(models):
    model = models["llava"]
    ids = torch.tensor([[1, 5, 6, 7]])
    request = VisualTokenPruner(model).prune({"input_ids": ids}, 0.5)
    assert request.is_identity and request.inputs["input_ids"] is ids


@pytest.mark.parametrize(
    ("name", "why"),
    [("qwen2-vl", "image_grid_thw"), ("qwen2.5-vl", "image_grid_thw"), ("qwen2-audio", "audio")],
)
def test_unsupported_architectures_say_why(name, why):
    model = zoo.build_model(name)
    assert why in unsupported_reason(model)
    with pytest.raises(PruningUnsupportedError, match=why):
        VisualTokenPruner(model)


def test_supported_architectures_have_no_reason(models):
    assert all(unsupported_reason(m) is None for m in models.values())


def test_wrapper_is_removed_when_generate_fails(models):
    model = models["llava"]
    pruner = VisualTokenPruner(model)
    request = pruner.prune(zoo.make_inputs(model), 0.5)
    with pytest.raises(RuntimeError, match="boom"), pruner.applied(request):
        assert "get_image_features" in vars(model.model)
        raise RuntimeError("boom")
    assert "get_image_features" not in vars(model.model)


def test_a_callers_own_wrapper_survives(models):
    """Another instance-level wrapper of get_image_features (a caller's) is used inside and restored after."""
    model = models["llava"]
    inner = model.model
    calls = []
    original = inner.get_image_features

    @functools.wraps(original)  # generate() reads the signature
    def theirs(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    inner.get_image_features = theirs
    try:
        pruner = VisualTokenPruner(model)
        request = pruner.prune(zoo.make_inputs(model), 0.5, method="fastv")
        assert calls and vars(inner)["get_image_features"] is theirs
        with pruner.applied(request):
            _generate(model, "llava", request.inputs, new_tokens=1)
        assert vars(inner)["get_image_features"] is theirs
    finally:
        del inner.get_image_features
