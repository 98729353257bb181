"""Held-out acceptance of issue 15: architectures that were neither in the zoo nor among the families
the estimator was built against (DeepSeek-VL, Janus-Pro, PaddleOCR-VL, Qwen2.5-Omni's thinker),
each shrunk to a tiny random-weight twin and estimated on meta within 1% of a live capture, with
image and audio token counts checked against transformers' own processor arithmetic; and the
refusals found on the way (variants served by another family's processor, per-layer size lists,
processors that need torchvision, audio a model cannot count) are clear errors or work. Mllama's
cross-attention images and Chameleon's VQ-encoded ones are tests/test_estimate_mllama.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from _shrink import tiny_config
from memwarden.errors import InputError
from memwarden.estimation.request import build_request, image_processor, placeholder_counts
from memwarden.estimation.resolve import CONFIG_DIR, resolve_model
from memwarden.record.meta import capture as meta
from test_estimate_families import _meta_and_live

# shipped config -> image side of its tiny twin (a multiple of patch x merge)
HELD_OUT = {
    "deepseek-vl-1.3b-chat": 64,
    "janus-pro-1b": 64,
    "paddleocr-vl": 56,
    "qwen2.5-omni-7b-thinker": 56,
}
AUDIO_SECONDS = {"qwen2.5-omni-7b-thinker": 5.0}


def _data(name: str) -> dict:
    return {k: v for k, v in json.loads((CONFIG_DIR / f"{name}.json").read_text()).items() if not k.startswith("_")}


@pytest.mark.parametrize("name", list(HELD_OUT))
def test_held_out_family_meta_estimate_matches_live(name: str) -> None:
    side = HELD_OUT[name]
    data = tiny_config(_data(name), side)
    for images in ((), ((side, side), (2 * side, side))):  # text alone; two images of two sizes
        est, live, tokens = _meta_and_live(data, images)
        assert abs(est - live) <= 0.01 * live, (name, images, est, live)
        assert (tokens["vision"] > 0) == bool(images)
    seconds = AUDIO_SECONDS.get(name)
    if seconds is not None:
        est, live, tokens = _meta_and_live(data, (), audio=seconds)
        assert abs(est - live) <= 0.01 * live, (name, seconds, est, live)
        # the processor's own count: 100 mel frames a second, halved by the conv, then pooled by 2
        omni = transformers.models.qwen2_5_omni.processing_qwen2_5_omni
        assert tokens["audio"] == omni._get_feat_extract_output_lengths(int(seconds * 100))


def _meta_model(name: str) -> tuple[object, object]:
    resolved = resolve_model(name)
    return resolved, meta.build_meta_model(resolved.config, torch.bfloat16, resolved.model_class)


def test_held_out_image_tokens_are_the_processors() -> None:
    # dynamic resolution: the Qwen2-VL-style processor's patch grid, merged 2 x 2
    for name in ("paddleocr-vl", "qwen2.5-omni-7b-thinker"):
        resolved, model = _meta_model(name)
        proc = image_processor(resolved.family, resolved.config)
        for w, h in ((448, 448), (1000, 600)):
            patches = proc.get_number_of_image_patches(h, w, {})
            assert placeholder_counts(model, proc, [(w, h)]) == [patches // proc.merge_size**2], (name, w, h)
    # fixed resolution: every image resized to the tower's 384 px, 16 px patches
    for name in ("deepseek-vl-1.3b-chat", "janus-pro-1b"):
        resolved, model = _meta_model(name)
        proc = image_processor(resolved.family, resolved.config)
        pixels = proc(images=[[np.zeros((600, 1000, 3), dtype=np.uint8)]], return_tensors="pt")["pixel_values"]
        per_image = (pixels.shape[-1] // resolved.config.vision_config.patch_size) ** 2
        assert per_image == 576
        assert placeholder_counts(model, proc, [(1000, 600), (448, 448)]) == [per_image, per_image]


def test_variants_use_the_processor_of_the_family_that_serves_them() -> None:
    # no image processor under their own model_type: transformers serves them with another family's
    served = {
        "qwen2_5_omni_thinker": "Qwen2VLImageProcessorPil",
        "qwen3_vl_moe": "Qwen2VLImageProcessorPil",
        "glm4v_moe": "Glm4vImageProcessorPil",
    }
    for family, expected in served.items():
        config = transformers.CONFIG_MAPPING[family]()
        assert type(image_processor(family, config)).__name__ == expected


def test_a_torchvision_only_processor_names_what_is_missing() -> None:
    pytest.importorskip("PIL")
    try:
        import torchvision  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torchvision is installed: the processor is built")
    with pytest.raises(InputError, match="torchvision"):
        image_processor("lfm2_vl", transformers.CONFIG_MAPPING["lfm2_vl"]())


def test_audio_a_model_cannot_count_is_refused_before_anything_is_built() -> None:
    data = tiny_config(transformers.CONFIG_MAPPING["phi4_multimodal"]().to_dict())
    config = transformers.CONFIG_MAPPING["phi4_multimodal"].from_dict(data)
    model = meta.build_meta_model(config, torch.float32, "Phi4MultimodalForCausalLM")
    with pytest.raises(InputError, match="get_audio_features"):
        build_request(model, config, images=(), prompt_tokens=4, new_tokens=1, batch=1, audio_seconds=5.0)


def test_per_layer_size_lists_are_accepted_and_still_bounded(tmp_path: Path) -> None:
    # Gemma 3n states intermediate_size per layer, Florence-2 patch_size per DaViT stage
    data = transformers.CONFIG_MAPPING["florence2"]().to_dict()
    assert isinstance(data["vision_config"]["patch_size"], list) and len(data["vision_config"]["patch_size"]) > 3
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**data, "architectures": ["Florence2ForConditionalGeneration"]}))
    assert resolve_model(str(path)).model_class == "Florence2ForConditionalGeneration"
    data["vision_config"]["patch_size"] = [7, 3, 1, 3]  # a 1-pixel patch is still refused
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="patch_size"):
        resolve_model(str(path))


def test_a_mixture_of_experts_vlm_is_estimated_as_it_runs() -> None:
    """transformers' grouped-mm experts count tokens per expert with histc on integer ids when the
    hidden states are not on the CPU (on meta, here): the meta capture counts as the CPU does.
    Qwen3-VL-MoE from transformers' own defaults, shrunk, in bf16 (the CPU's grouped mm takes no
    fp32): meta within 1% of a live capture."""
    import gc

    import memwarden
    from memwarden.estimation.families import model_class_for
    from memwarden.estimation.metamodel import forget_models

    data = tiny_config(transformers.CONFIG_MAPPING["qwen3_vl_moe"]().to_dict(), 64)
    cfg = transformers.CONFIG_MAPPING[data["model_type"]].from_dict(data)
    name = model_class_for(data["model_type"], data.get("architectures"), "test")
    meta_model = meta.build_meta_model(cfg, torch.bfloat16, name)
    inputs, _ = build_request(meta_model, cfg, images=(), prompt_tokens=12, new_tokens=3, batch=1)
    kwargs = {"do_sample": False, "num_beams": 1, "eos_token_id": None, "pad_token_id": 0, "max_new_tokens": 3}
    with meta.MetaCapture(meta_model, inputs) as mcap, torch.inference_mode():
        meta_model.generate(**inputs, min_new_tokens=3, **kwargs)
    torch.manual_seed(0)
    live = getattr(transformers, name)._from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    assert getattr(live.config.get_text_config(), "num_experts", 0) > 1
    with torch.inference_mode():
        live.generate(**inputs, min_new_tokens=3, **kwargs)  # lazy kernels warmed
    forget_models()
    gc.collect()
    with memwarden.capture() as cap, torch.inference_mode():
        live.generate(**inputs, min_new_tokens=3, **kwargs)
    est, real = memwarden.summary(mcap.trace).peak_bytes, memwarden.summary(cap.trace).peak_bytes
    assert abs(est - real) <= 0.01 * real, (est, real)


# -- the held-out architectures of the second check ----------------------------------------------


@pytest.mark.parametrize("source", ["qwen3_vl_moe", "glm-4.5v"])
def test_mixture_of_experts_vlms_with_images_match_live(source: str) -> None:
    """Qwen3-VL-MoE from transformers' defaults (shrunk: its vision out_hidden_size then matches the
    text width) and GLM-4.5V from its published config (the class defaults state no head_dim and no
    mrope_section, so they do not run in transformers itself): text and one image, meta within 1%
    of a live capture, in bf16."""
    if source in transformers.CONFIG_MAPPING:
        data = tiny_config(transformers.CONFIG_MAPPING[source]().to_dict(), 64)
        side = 64
    else:
        data, side = tiny_config(_data(source), 56), 56
    # Qwen3-VL-MoE's text request is test_a_mixture_of_experts_vlm_is_estimated_as_it_runs
    requests = (((side, side),),) if source == "qwen3_vl_moe" else ((), ((side, side),))
    for images in requests:
        est, live, tokens = _meta_and_live(data, images, dtype=torch.bfloat16)
        assert abs(est - live) <= 0.01 * live, (source, images, est, live)
        assert (tokens["vision"] > 0) == bool(images)


def test_image_features_narrower_than_the_text_model_are_one_clear_error() -> None:
    # Qwen3-VL-MoE's class defaults: vision out_hidden_size 3584, text hidden_size 2048; transformers
    # itself fails later with "tokens: 196, features: 196"
    data = tiny_config(transformers.CONFIG_MAPPING["qwen3_vl_moe"]().to_dict(), 64)
    data["vision_config"]["out_hidden_size"] = 96
    config = transformers.CONFIG_MAPPING["qwen3_vl_moe"].from_dict(data)
    model = meta.build_meta_model(config, torch.bfloat16, "Qwen3VLMoeForConditionalGeneration")
    with pytest.raises(InputError, match="96 wide but the text model's embeddings are 64"):
        build_request(model, config, images=((64, 64),), prompt_tokens=8, new_tokens=1, batch=1)


def test_qwen2_5_omni_video_uses_the_video_processor_that_serves_it() -> None:
    """Qwen2.5-Omni's video processor is Qwen2-VL's (transformers' video mapping names it only with
    torchvision): frames resized within its pixel limits, temporal patches of 2, 2 x 2 merge; the
    rope index takes the processor's seconds per temporal patch. Meta within 1% of live."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    from memwarden.estimation.request_media import _video_defaults

    data = tiny_config(_data("qwen2.5-omni-7b-thinker"), 56)
    est, live, tokens = _meta_and_live(data, (), videos=((56, 56, 5),))
    assert abs(est - live) <= 0.01 * live, (est, live)
    size = _video_defaults("qwen2_vl")["size"]
    assert size == {"shortest_edge": 128 * 28 * 28, "longest_edge": 768 * 28 * 28}  # Qwen2VLVideoProcessor's
    vc = data["vision_config"]
    factor = vc["patch_size"] * vc["spatial_merge_size"]
    h, w = smart_resize(56, 56, factor=factor, min_pixels=size["shortest_edge"], max_pixels=size["longest_edge"])
    temporal = -(-5 // vc["temporal_patch_size"])  # the last patch padded with the last frame
    assert tokens["vision"] == temporal * (h // factor) * (w // factor)


def test_an_encoder_decoder_card_counts_the_prompt_its_encoder_was_given(tmp_path: Path) -> None:
    # Florence-2: generate() runs the encoder (image features merged into the prompt) outside the
    # model's root call, whose prefill takes decoder ids only; the card counts what generate() was given
    import memwarden

    data = tiny_config(transformers.CONFIG_MAPPING["florence2"]().to_dict())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**data, "architectures": ["Florence2ForConditionalGeneration"]}))
    card = memwarden.estimate(str(path), prompt_tokens=16, new_tokens=2, images=[(64, 64)], dtype="float32")
    proc = image_processor("florence2", transformers.CONFIG_MAPPING["florence2"].from_dict(data))
    side = proc(images=[np.zeros((64, 64, 3), dtype=np.uint8)], return_tensors="pt")["pixel_values"].shape[-1]
    # DaViT: stride 4 then 2, 2, 2 (32 in all), plus one pooled token, as Florence2Processor's image_seq_length
    assert card.tokens == {"vision": (side // 32) ** 2 + 1, "audio": 0, "text": 16}
