"""estimate: the meta capture agrees with a live capture, real configs have their published sizes,
a 7B estimate costs little memory, the card's JSON/Markdown, suggestions and bad input."""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

import memwarden
from memwarden.analyze.timeline import summary
from memwarden.commands import estimate as estimate_command
from memwarden.errors import InputError
from memwarden.estimation import resolve
from memwarden.estimation import run as est
from memwarden.estimation.card import CARD_KEYS
from memwarden.estimation.metamodel import forget_models
from memwarden.models import zoo
from memwarden.record.meta import capture as meta
from memwarden.trace.model import Action, Category

# (model, request) pairs checked against a live run: every zoo model, two image sizes for the
# dynamic-resolution models, two prompt lengths, batch 2.
AGREEMENT = [(name, {}) for name in zoo.NAMES] + [
    ("qwen2-vl", {"image_size": (224, 168)}),
    ("qwen2.5-vl", {"image_size": (56, 280)}),
    ("llava", {"prompt_tokens": 200}),
    ("gemma3", {"batch": 2}),
    ("qwen2-audio", {"audio_seconds": 0.5}),
]


def _live_and_meta(name: str, request: dict) -> tuple[memwarden.Trace, memwarden.Trace]:
    request = dict(request)
    prompt = request.pop("prompt_tokens", 12)
    model = zoo.build_model(name)
    inputs = zoo.make_inputs(model, prompt_tokens=prompt, **request)
    kwargs = zoo.generate_kwargs(name)
    with torch.inference_mode():
        model.generate(**inputs, max_new_tokens=1, **kwargs)  # lazy kernels and caches warmed outside the capture
    forget_models()  # earlier estimates' kept meta models hold real CPU buffers the live capture would count
    gc.collect()
    with memwarden.capture() as cap, torch.inference_mode():
        model.generate(**inputs, max_new_tokens=3, **kwargs)
    meta_model = meta.build_meta_model(zoo.build_config(name))
    meta_in = meta.meta_inputs(inputs)
    with meta.MetaCapture(meta_model, meta_in) as mcap, torch.inference_mode():
        meta_model.generate(**meta_in, max_new_tokens=3, **kwargs)
    return cap.trace, mcap.trace


@pytest.mark.parametrize(("name", "request_"), AGREEMENT, ids=[f"{n}-{r}" for n, r in AGREEMENT])
def test_meta_peak_matches_live_peak(name: str, request_: dict) -> None:
    live, estimated = _live_and_meta(name, request_)
    s_live, s_meta = summary(live), summary(estimated)
    assert abs(s_meta.peak_bytes - s_live.peak_bytes) <= 0.01 * s_live.peak_bytes, (
        s_meta.peak_bytes,
        s_live.peak_bytes,
    )
    # Above the weights too: activations, KV cache and temporaries, not just the weights, agree.
    above_live = s_live.peak_bytes - s_live.weights_bytes
    above_meta = s_meta.peak_bytes - s_meta.weights_bytes
    assert abs(above_meta - above_live) <= 0.02 * above_live, (above_meta, above_live)
    assert s_meta.weights_bytes == s_live.weights_bytes
    assert set(s_meta.by_phase_peak) == set(s_live.by_phase_peak) >= {"encode", "prefill", "decode"}
    for phase, peak in s_live.by_phase_peak.items():
        assert abs(s_meta.by_phase_peak[phase] - peak) <= 0.01 * peak, (phase, s_meta.by_phase_peak[phase], peak)
    assert [s["phase"] for s in estimated.metadata["steps"]] == [s["phase"] for s in live.metadata["steps"]]
    assert [s.get("tokens") for s in estimated.metadata["steps"]] == [s.get("tokens") for s in live.metadata["steps"]]
    cats = set(estimated.events["category"][estimated.events["action"] == Action.ALLOC].tolist())
    assert Category.KV_CACHE in cats and Category.ACTIVATION in cats


# Published parameter counts (model cards / the checkpoints' safetensors index).
PUBLISHED_PARAMETERS = {
    "llava-1.5-7b": 7.06e9,
    "qwen2-vl-2b-instruct": 2.21e9,
    "qwen2-vl-7b-instruct": 8.29e9,
    "qwen2.5-vl-3b-instruct": 3.75e9,
    "paligemma-3b": 2.92e9,
    "smolvlm-instruct": 2.25e9,
    "smolvlm-256m-instruct": 0.256e9,
    "idefics3-8b": 8.46e9,
    "gemma-3-4b-it": 4.30e9,
    "qwen2-audio-7b-instruct": 8.40e9,
    "llava-v1.6-mistral-7b": 7.57e9,
    "llava-next-video-7b": 7.06e9,
    "llava-onevision-qwen2-0.5b-ov": 0.894e9,
    "aya-vision-8b": 8.63e9,
    "idefics2-8b": 8.40e9,
    "smolvlm2-2.2b-instruct": 2.25e9,
    "qwen3-vl-2b-instruct": 2.13e9,
    "glm-4.1v-9b-thinking": 10.3e9,
    "llama-3.2-1b": 1.24e9,
    "qwen2.5-0.5b-instruct": 0.494e9,
}


def test_real_configs_have_their_published_sizes() -> None:
    assert set(resolve.model_names()["real"]) >= set(PUBLISHED_PARAMETERS)
    for name, published in PUBLISHED_PARAMETERS.items():
        resolved = resolve.resolve_model(name)
        model = meta.build_meta_model(resolved.config, torch.bfloat16, resolved.model_class)
        params = {id(p): p for p in model.parameters()}.values()
        weight_bytes = sum(p.untyped_storage().nbytes() for p in params)
        assert abs(weight_bytes - 2 * published) <= 0.02 * 2 * published, (name, weight_bytes / 2)
        assert all(p.is_meta for p in params)


MEMORY_PROBE = """
import resource, json
from memwarden.estimation import run as est, resolve
resolve.resolve_model("llava-1.5-7b")
import transformers, torch  # noqa: F401  (imports are the baseline)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
card = est.estimate("llava-1.5-7b", images=[(336, 336)], dtype="bfloat16", prompt_tokens=64, new_tokens=2)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_kib": after - before, "card": card.to_json()}))
"""


def test_7b_estimate_costs_little_memory() -> None:
    done = subprocess.run([sys.executable, "-c", MEMORY_PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["growth_kib"] < 1024 * 1024  # well under 1 GiB for a 14 GB (bf16) model
    card = result["card"]
    assert abs(card["weights_bytes"] - 2 * 7.06e9) <= 0.02 * 2 * 7.06e9
    assert card["tokens"] == {"vision": 576, "audio": 0, "text": 64}
    assert card["peak_bytes"] > card["weights_bytes"] + card["kv_cache_bytes"]
    # KV cache after 64 + 576 prompt tokens and 2 generated (the last one is not cached): 32 layers x K,V x 4096 x bf16
    assert card["kv_cache_bytes"] == 32 * 2 * (640 + 1) * 4096 * 2


def test_card_json_has_exactly_the_card_keys_and_markdown_a_table() -> None:
    card = est.estimate("llava", images=[(32, 32)], prompt_tokens=12, new_tokens=2, device="jetson-orin-nano-8gb")
    data = json.loads(json.dumps(card.to_json()))
    assert tuple(data) == CARD_KEYS
    # a Jetson computes with CUDA: the verdict compares the allocator's reserved peak (workspaces included)
    assert data["runtime"]["reserved_peak_bytes"] > data["peak_bytes"]
    assert (
        data["fits"] is True and data["headroom_bytes"] == data["usable_bytes"] - data["runtime"]["reserved_peak_bytes"]
    )
    assert set(data["phases"]) == {"load", "input", "encode", "prefill", "decode"}
    assert set(data["phases"]["load"]["by_category"]) <= {"weight", "buffer"}  # the request is its own phase
    assert data["logits"] == "last" and set(data["versions"]) == {"transformers", "torch"}
    assert max(p["peak_bytes"] for p in data["phases"].values()) == data["peak_bytes"]
    assert data["tokens"] == {"vision": 16, "audio": 0, "text": 12}
    md = card.to_markdown()
    assert "| phase | peak |" in md and "|---|" in md and "| decode |" in md
    assert "Jetson Orin Nano" in md and "fits" in md


@dataclass(frozen=True)
class _TinyDevice:
    id: str = "tiny-test-device"
    name: str = "a device with 1.7 MB"
    usable_bytes: int = 1_700_000  # more than tiny qwen2-vl's weights (1.1 MB), less than a 224 px request


def test_suggestions_are_ranked_and_say_how_they_were_predicted() -> None:
    card = est.estimate("qwen2-vl", images=[(224, 224)], prompt_tokens=12, new_tokens=2, device=_TinyDevice())
    assert card.fits is False and card.suggestions
    kinds = {s.kind for s in card.suggestions}
    assert {"weights_dtype", "kv_dtype", "max_image", "offload_layers"} <= kinds
    assert {s.method for s in card.suggestions} <= {"rerun", "arithmetic"}
    weights = {s.setting["weights_dtype"]: s for s in card.suggestions if s.kind == "weights_dtype"}
    assert weights["int4"].method == "rerun" and weights["int4"].predicted_peak_bytes < card.peak_bytes
    fitting = [s.fits for s in card.suggestions]
    assert fitting == sorted(fitting, reverse=True)  # the changes that fit come first
    for s in card.suggestions:
        assert s.fits == (s.predicted_peak_bytes <= card.usable_bytes)
    image = next(s for s in card.suggestions if s.kind == "max_image")
    w, h = image.setting["images"][0]
    assert w % 28 == 0 and h % 28 == 0 and w < 224
    assert (
        est.estimate("qwen2-vl", images=[(w, h)], prompt_tokens=12, new_tokens=2).peak_bytes
        == image.predicted_peak_bytes
    )


def test_quantized_weights_and_kv_cache_shrink_their_bytes() -> None:
    plain = est.estimate("llava", prompt_tokens=64, new_tokens=3)
    int4 = est.estimate("llava", prompt_tokens=64, new_tokens=3, weights_dtype="int4")
    fp8 = est.estimate("llava", prompt_tokens=64, new_tokens=3, kv_dtype="float8")
    assert int4.weights_bytes < 0.7 * plain.weights_bytes and int4.peak_bytes < plain.peak_bytes
    assert fp8.kv_cache_bytes * 4 == pytest.approx(plain.kv_cache_bytes, rel=0.01)
    with pytest.raises(InputError, match="sliding-window"):
        est.estimate("gemma3", kv_dtype="int8")


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="memwarden")
    estimate_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["estimate", *argv])
    return int(args.func(args))


def test_cli_card_and_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        _cli("llava", "--prompt-tokens", "12", "--new-tokens", "2", "--format", "md", "--device", "rtx-4060-8gb") == 0
    )
    out = capsys.readouterr().out
    assert "| phase | peak |" in out and "RTX 4060" in out
    assert _cli("paligemma", "--prompt-tokens", "12", "--new-tokens", "1", "--json") == 0
    assert tuple(json.loads(capsys.readouterr().out)) == CARD_KEYS
    device = "raspberry-pi-5-8gb"
    argv = ["qwen2-vl", "--sweep", "--image", "112x112", "--image", "224x224", "--prompt-tokens", "16,64"]
    assert _cli(*argv, "--new-tokens", "1", "--device", device, "--json") == 0
    result = json.loads(capsys.readouterr().out)
    assert [p["value"] for p in result["axes"]["image"]] == [[112, 112], [224, 224]]
    assert result["limits"][device] == {"image": [224, 224], "prompt_tokens": 64}
    assert _cli(*argv, "--new-tokens", "1", "--device", device) == 0
    assert "largest image 224x224" in capsys.readouterr().out


def test_cli_exits_1_when_the_request_does_not_fit_the_device(capsys: pytest.CaptureFixture[str]) -> None:
    """issue 44: estimate with a device says "does not fit" through its exit status too (as partition
    and check do); --json keeps the verdict."""
    argv = ["llava-1.5-7b", "--dtype", "float32", "--prompt-tokens", "16", "--new-tokens", "1", "--no-suggest"]
    assert _cli(*argv, "--device-profile", "raspberry-pi-5-8gb", "--json", "--quiet") == 1
    assert json.loads(capsys.readouterr().out)["fits"] is False
    assert (
        _cli("llava", "--prompt-tokens", "12", "--new-tokens", "1", "--device-profile", "rtx-4060-8gb", "--quiet") == 0
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["no-such-model"], "unknown model 'no-such-model'; valid names: zoo llava"),
        (["llava", "--image", "448"], "--image takes WIDTHxHEIGHT"),
        (["llava", "--image", "0x10"], "--image takes WIDTHxHEIGHT"),
        (["llava", "--image", "64x64"], "takes images of exactly 32x32 px"),
        (["qwen2-vl", "--image", "100x100"], "multiples of 28"),
        (["llava", "--prompt-tokens", "-5"], "prompt_tokens must be an integer >= 1"),
        (["llava", "--new-tokens", "0"], "new_tokens must be an integer >= 1"),
        (["llava", "--new-tokens", "x"], "--new-tokens takes an integer"),
        (["llava", "--batch", "0"], "--batch 0: give 1 to 4096 sequences per request"),
        (["llava", "--dtype", "int3"], "dtype must be one of"),
        (["llava", "--weights-dtype", "int3"], "weights_dtype must be one of"),
        (["qwen2-vl", "--image", "56x56", "--image", "56x56", "--prompt-tokens", "3"], "needs prompt_tokens >= 4"),
        (["llava", "--audio-seconds", "3"], "vision model"),
        (["qwen2-audio", "--audio-seconds", "99"], "takes 0.07 to 2 s of audio"),
        (["llava", "--device", "no-such-device"], "no-such-device"),
    ],
)
def test_bad_input_is_one_input_error(argv: list[str], message: str) -> None:
    with pytest.raises(InputError) as info:
        _cli(*argv)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_config_paths_resolve(tmp_path: pytest.TempPathFactory) -> None:
    source = resolve.CONFIG_DIR / "smolvlm-256m-instruct.json"
    folder = tmp_path / "SmolVLM-256M"  # type: ignore[operator]
    folder.mkdir()
    (folder / "config.json").write_text(source.read_text())
    by_folder = resolve.resolve_model(str(folder))
    by_file = resolve.resolve_model(str(folder / "config.json"))
    assert by_folder.family == by_file.family == "idefics3" and by_folder.name == "SmolVLM-256M"
    (folder / "config.json").write_text('{"model_type": "bert"}')  # a text model transformers can generate with
    assert resolve.resolve_model(str(folder)).model_class == "BertLMHeadModel"
    (folder / "config.json").write_text('{"model_type": "no_such_type"}')
    with pytest.raises(InputError, match="'no_such_type' is not a transformers"):
        resolve.resolve_model(str(folder))
    (folder / "config.json").write_text('{"model_type": "bert", "architectures": ["os.system"]}')
    assert resolve.resolve_model(str(folder)).model_class == "BertLMHeadModel"  # a name outside the mappings is ignored
    (folder / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="not a readable config.json"):
        resolve.resolve_model(str(folder))


def test_several_images_and_no_image(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        _cli("llava", "--image", "32x32", "--image", "32x32", "--prompt-tokens", "12", "--new-tokens", "1", "--json")
        == 0
    )
    two = json.loads(capsys.readouterr().out)
    one = est.estimate("llava", images=[(32, 32)], prompt_tokens=12, new_tokens=1)
    assert two["tokens"] == {"vision": 2 * one.tokens["vision"], "audio": 0, "text": 12}
    assert two["peak_bytes"] > one.peak_bytes
    none = est.estimate("llava", prompt_tokens=12, new_tokens=1)
    assert none.tokens == {"vision": 0, "audio": 0, "text": 12} and "encode" not in none.phases
    # Qwen-VL finds images as runs of placeholders: two images are two runs, each in its markers
    card = est.estimate("qwen2-vl", images=[(56, 56), (112, 56)], prompt_tokens=12, new_tokens=1)
    assert card.tokens["vision"] == (56 * 56 + 112 * 56) // (28 * 28)


def test_memwarden_estimate_is_callable() -> None:
    card = memwarden.estimate("llava", prompt_tokens=12, new_tokens=1)  # type: ignore[operator]
    assert card.peak_bytes > card.weights_bytes > 0


def test_the_short_dtype_names_users_type_mean_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    """bf16, fp16, torch.float32, nf4 and fp8 are what PyTorch, bitsandbytes and transformers users type."""
    outputs = []
    for argv in (
        ["--dtype", "bfloat16", "--kv-dtype", "float8"],
        ["--dtype", "bf16", "--kv-dtype", "fp8"],
        ["--dtype", "torch.bfloat16", "--kv-dtype", "FP8"],
    ):
        assert _cli("llava", "--prompt-tokens", "12", "--new-tokens", "2", "--json", *argv) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1] == outputs[2]
    assert _cli("llava", "--prompt-tokens", "12", "--new-tokens", "2", "--json", "--weights-dtype", "nf4") == 0
    nf4 = json.loads(capsys.readouterr().out)
    assert _cli("llava", "--prompt-tokens", "12", "--new-tokens", "2", "--json", "--weights-dtype", "int4") == 0
    assert nf4 == json.loads(capsys.readouterr().out)


def test_a_live_capture_does_not_count_the_estimators_kept_models() -> None:
    """An estimate keeps its meta models, whose rotary buffers are real CPU tensors; a live capture
    later in the same process (a notebook that estimates, then runs) drops them as it starts,
    instead of counting them as the process's weights (Gemma 3's vision position ids: 32 KiB)."""
    from memwarden.estimation import metamodel
    from memwarden.record.live.reference import state_bytes

    memwarden.estimate("gemma-3-4b-it", prompt_tokens=4, new_tokens=1)
    assert any(not b.is_meta for m in metamodel._MODELS.values() for b in m.buffers())  # real CPU buffers
    model = zoo.build_model("llava")
    inputs = zoo.make_inputs(model, prompt_tokens=8)
    with memwarden.capture() as cap, torch.inference_mode():
        model(**inputs)
    assert summary(cap.trace).weights_bytes == state_bytes(model)
    assert not metamodel._MODELS
