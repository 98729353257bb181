"""estimate on transformers families beyond the zoo: each shipped config, shrunk to a tiny
random-weight model of the same architecture, is estimated on meta within 1% of a live capture
(text-only and image requests), and the model class comes only from transformers' auto mappings."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch
import transformers

import memwarden
from _shrink import tiny_config
from memwarden.analyze.timeline import summary
from memwarden.errors import InputError
from memwarden.estimation.families import model_class_for
from memwarden.estimation.metamodel import forget_models
from memwarden.estimation.request import build_request
from memwarden.estimation.resolve import CONFIG_DIR, resolve_model
from memwarden.record.meta import capture as meta

# shipped config -> image side of its tiny twin (a multiple of the patch that its pooling divides)
FAMILIES = {
    "llava-v1.6-mistral-7b": 56,
    "llava-next-video-7b": 56,
    "llava-onevision-qwen2-0.5b-ov": 56,
    "mistral-small-3.1-24b-instruct": 56,
    "internvl3-1b": 56,
    "aya-vision-8b": 56,
    "idefics2-8b": 56,
    "smolvlm2-2.2b-instruct": 84,  # pixel shuffle 3: 6 x 6 patches
    "qwen3-vl-2b-instruct": 64,
    "ovis2-1b": 56,
    "glm-4.1v-9b-thinking": 56,
    "voxtral-mini-3b-2507": None,  # audio: requests of AUDIO_SECONDS
    "llama-3.2-1b": None,  # text-only causal LMs
    "qwen2.5-0.5b-instruct": None,
}


AUDIO_SECONDS = {"voxtral-mini-3b-2507": (20.0, 45.0)}  # one and two of Voxtral's 30 s windows
# shipped config -> videos (W, H, frames) of its tiny twin; the family's video processor frames them
VIDEOS = {
    "llava-next-video-7b": (56, 56, 4),
    "llava-onevision-qwen2-0.5b-ov": (56, 56, 3),
    "qwen2-vl-2b-instruct": (56, 56, 5),  # padded to 3 temporal patches of 2 frames
}


def _tiny(name: str) -> tuple[dict, int | None]:
    data = {k: v for k, v in json.loads((CONFIG_DIR / f"{name}.json").read_text()).items() if not k.startswith("_")}
    side = FAMILIES[name]
    return tiny_config(data, side), side


def _meta_and_live(
    data: dict,
    images: tuple,
    prompt: int = 12,
    new: int = 3,
    videos: tuple = (),
    audio: float | None = None,
    dtype: torch.dtype = torch.float32,  # bfloat16 for grouped-mm experts: the CPU's grouped mm takes no fp32
) -> tuple[int, int, dict]:
    cfg = transformers.CONFIG_MAPPING[data["model_type"]].from_dict(data)
    name = model_class_for(data["model_type"], data.get("architectures"), "test")
    meta_model = meta.build_meta_model(cfg, dtype, name)
    inputs, tokens = build_request(
        meta_model,
        cfg,
        images=images,
        prompt_tokens=prompt,
        new_tokens=new,
        batch=1,
        videos=videos,
        audio_seconds=audio,
    )
    kwargs = {"do_sample": False, "num_beams": 1, "eos_token_id": None, "pad_token_id": 0}
    with meta.MetaCapture(meta_model, inputs) as mcap, torch.inference_mode():
        meta_model.generate(**inputs, max_new_tokens=new, min_new_tokens=new, **kwargs)
    torch.manual_seed(0)
    live = getattr(transformers, name)._from_config(cfg, dtype=dtype, attn_implementation="sdpa").eval()
    # the same request with real pixels: the live forward checks placeholders == image features
    live_inputs = {k: (torch.randn(v.shape, dtype=v.dtype) if v.is_floating_point() else v) for k, v in inputs.items()}
    with torch.inference_mode():
        live.generate(**live_inputs, max_new_tokens=1, min_new_tokens=1, **kwargs)  # lazy kernels warmed
    forget_models()  # kept meta models of earlier tests hold CPU buffers the live capture would count
    gc.collect()
    with memwarden.capture() as cap, torch.inference_mode():
        live.generate(**live_inputs, max_new_tokens=new, min_new_tokens=new, **kwargs)
    return summary(mcap.trace).peak_bytes, summary(cap.trace).peak_bytes, tokens


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_meta_estimate_matches_live(name: str) -> None:
    data, side = _tiny(name)
    requests: list[tuple] = [()]
    if side is not None:
        requests.append(((side, side),))
    for images in requests:
        est, live, tokens = _meta_and_live(data, images)
        assert abs(est - live) <= 0.01 * live, (name, images, est, live)
        assert (tokens["vision"] > 0) == bool(images)
    audio_tokens = []
    for seconds in AUDIO_SECONDS.get(name, ()):
        est, live, tokens = _meta_and_live(data, (), audio=seconds)
        assert abs(est - live) <= 0.01 * live, (name, seconds, est, live)
        audio_tokens.append(tokens["audio"])
    if audio_tokens:  # 45 s is two of the encoder's 30 s windows, 20 s one
        assert audio_tokens[1] == 2 * audio_tokens[0] > 0


@pytest.mark.parametrize("name", list(VIDEOS))
def test_video_meta_estimate_matches_live(name: str) -> None:
    data = {k: v for k, v in json.loads((CONFIG_DIR / f"{name}.json").read_text()).items() if not k.startswith("_")}
    data = tiny_config(data, 56)
    video = VIDEOS[name]
    est, live, tokens = _meta_and_live(data, (), videos=(video,))
    assert abs(est - live) <= 0.01 * live, (name, est, live)
    longer = _meta_and_live(data, (), videos=((video[0], video[1], 2 * video[2]),))
    assert abs(longer[0] - longer[1]) <= 0.01 * longer[1]
    assert tokens["vision"] > 0 and longer[2]["vision"] > tokens["vision"]


def test_two_images_place_both_runs_of_placeholders() -> None:
    data, side = _tiny("llava-v1.6-mistral-7b")
    assert side is not None
    one = _meta_and_live(data, ((side, side),))
    two = _meta_and_live(data, ((side, side), (2 * side, side)))
    assert two[2]["vision"] > 2 * one[2]["vision"] - 1  # the wide image is tiled into more crops
    assert abs(two[0] - two[1]) <= 0.01 * two[1]


def test_shipped_configs_resolve_to_their_architecture_class() -> None:
    for name in FAMILIES:
        resolved = resolve_model(name)
        data = json.loads((CONFIG_DIR / f"{name}.json").read_text())
        assert resolved.model_class == data["architectures"][0]
        assert resolved.checkpoint_dtype in ("float16", "bfloat16", "float32")
        assert data["_memwarden_source"]


def test_architectures_outside_the_auto_mappings_are_never_used(tmp_path: Path) -> None:
    data = json.loads((CONFIG_DIR / "qwen2.5-0.5b-instruct.json").read_text())
    for bogus in (["os.system"], ["AutoTokenizer"], ["LlavaForConditionalGeneration"], "Qwen2Model"):
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**data, "architectures": bogus}))
        assert resolve_model(str(path)).model_class == "Qwen2ForCausalLM"
    path.write_text(json.dumps({**data, "model_type": "not_a_family"}))
    with pytest.raises(InputError, match="not a transformers"):
        resolve_model(str(path))
