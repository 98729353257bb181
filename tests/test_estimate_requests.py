"""Requests as users send them: text-only, tiled and pixel-limited images give the processor's
token counts; bad sizes fail fast with one clear error; the checkpoint's dtype is the default."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers

from memwarden.errors import InputError
from memwarden.estimation import run as est
from memwarden.estimation.request import image_processor, placeholder_counts
from memwarden.estimation.resolve import CONFIG_DIR, resolve_model
from memwarden.record.meta import capture as meta


def _meta(name: str) -> tuple[object, object]:
    resolved = resolve_model(name)
    return resolved, meta.build_meta_model(resolved.config, torch.bfloat16, resolved.model_class)


def test_smolvlm_large_image_is_tiled_like_the_processor() -> None:
    resolved, model = _meta("smolvlm2-2.2b-instruct")
    proc = image_processor("smolvlm", resolved.config)
    vc = resolved.config.vision_config
    per_tile = (vc.image_size // vc.patch_size) ** 2 // resolved.config.scale_factor**2
    for w, h in ((1536, 1536), (384, 384), (1000, 600)):
        tiles = proc.get_number_of_image_patches(h, w, {})[0]  # (tiles + the global image, rows, cols)
        assert placeholder_counts(model, proc, [(w, h)]) == [tiles * per_tile]
    # the processor resizes the longest edge to 4 tiles: a wide image makes fewer rows of tiles
    assert placeholder_counts(model, proc, [(1000, 600)])[0] < placeholder_counts(model, proc, [(1536, 1536)])[0]


def test_qwen2_vl_max_pixels_like_the_processor() -> None:
    for max_pixels in (None, 200_000):
        proc = image_processor("qwen2_vl", resolve_model("qwen2-vl-2b-instruct").config, max_pixels)
        reference = transformers.Qwen2VLImageProcessorPil(
            **({"size": {"shortest_edge": 56 * 56, "longest_edge": max_pixels}} if max_pixels else {})
        )
        for w, h in ((448, 448), (1920, 1080)):
            patches = reference.get_number_of_image_patches(h, w, {})
            assert proc.get_number_of_image_patches(h, w, {}) == patches
    card = est.estimate("qwen2-vl-2b-instruct", images=[(448, 448)], prompt_tokens=4, new_tokens=1)
    assert card.tokens["vision"] == 448 * 448 // (28 * 28)


def test_text_only_request_has_no_image_and_one_token_works() -> None:
    card = est.estimate("qwen2-vl-2b-instruct", prompt_tokens=1, new_tokens=2)
    assert card.tokens == {"vision": 0, "audio": 0, "text": 1}
    assert "encode" not in card.phases


@dataclass(frozen=True)
class _Device:
    id: str = "small"
    name: str = "a 1.5 GiB device"
    usable_bytes: int = 3 * 2**29


def test_checkpoint_dtype_is_the_default_and_a_wider_one_is_priced() -> None:
    card = est.estimate("qwen2.5-0.5b-instruct", prompt_tokens=4, new_tokens=1)
    assert card.request is not None and card.request.dtype == "bfloat16"
    wide = est.estimate("qwen2.5-0.5b-instruct", prompt_tokens=4, new_tokens=1, dtype="float32", device=_Device())
    assert not wide.fits
    change = [s for s in wide.suggestions if s.kind == "dtype"]
    assert change and change[0].setting == {"dtype": "bfloat16"} and change[0].predicted_peak_bytes < wide.peak_bytes


def test_sizes_are_validated_before_anything_is_built(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="context"):
        est.estimate("qwen2-vl-7b-instruct", prompt_tokens=200_000_000)
    data = json.loads((CONFIG_DIR / "qwen2-vl-2b-instruct.json").read_text())
    data["vision_config"]["patch_size"] = 1
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="patch_size"):
        est.estimate(str(path), images=[(448, 448)])
    with pytest.raises(InputError, match="MPx"):
        est.estimate("llava-v1.6-mistral-7b", images=[(20000, 20000)])


def _cli(*argv: str) -> int:
    import argparse

    from memwarden.commands import estimate as estimate_command

    parser = argparse.ArgumentParser(prog="memwarden")
    estimate_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["estimate", *argv])
    return int(args.func(args))


def test_cli_max_pixels_and_checkpoint_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["qwen2-vl-2b-instruct", "--image", "1920x1080", "--prompt-tokens", "4", "--new-tokens", "1", "--json"]
    assert _cli(*argv, "--max-pixels", "200000", "--quiet") == 0
    card = json.loads(capsys.readouterr().out)
    reference = transformers.Qwen2VLImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 200_000})
    assert card["tokens"]["vision"] == reference.get_number_of_image_patches(1080, 1920, {}) // 4
    assert card["versions"]["transformers"] == transformers.__version__
    assert _cli(*argv) == 0
    assert json.loads(capsys.readouterr().out)["tokens"]["vision"] > card["tokens"]["vision"]
    with pytest.raises(SystemExit):
        _cli("--help")
    assert "checkpoint's dtype" in capsys.readouterr().out.replace("\n", " ").replace("  ", " ")
    with pytest.raises(InputError, match="max_pixels applies to dynamic-resolution"):
        est.estimate("llava-1.5-7b", images=[(336, 336)], max_pixels=100_000)


def test_full_logits_cost_every_prompt_position_in_float32() -> None:
    prompt = 512
    last = est.estimate("qwen2.5-0.5b-instruct", prompt_tokens=prompt, new_tokens=2)
    full = est.estimate("qwen2.5-0.5b-instruct", prompt_tokens=prompt, new_tokens=2, logits="full")
    vocab = resolve_model("qwen2.5-0.5b-instruct").config.vocab_size
    assert full.logits == "full" and full.to_json()["logits"] == "full"
    grown = full.phases["prefill"]["peak_bytes"] - last.phases["prefill"]["peak_bytes"]
    assert grown >= 4 * (prompt - 1) * vocab  # at least the float32 copy of every position's logits
    assert "logits: every prompt position" in full.to_text()
    assert full.weights_bytes == last.weights_bytes


def _video_tokens(name: str, video: tuple[int, int, int]) -> int:
    card = est.estimate(name, videos=[video], prompt_tokens=4, new_tokens=1)
    assert card.request is not None and card.request.videos == (video,)
    return int(card.tokens["vision"])


def test_qwen2_vl_video_like_the_video_processor() -> None:
    config = resolve_model("qwen2-vl-2b-instruct").config
    try:  # the video processor itself where its torchvision backend is installed
        reference = transformers.Qwen2VLVideoProcessor()
        size = dict(reference.size)
    except ImportError:  # its class defaults (video_processing_qwen2_vl.py), the patch grid by the image processor
        size = {"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768}
    frames_proc = transformers.Qwen2VLImageProcessorPil(size=size)
    for w, h, frames in ((448, 448, 16), (1280, 720, 9), (320, 240, 1)):
        grid_t = -(-frames // config.vision_config.temporal_patch_size)  # the last patch padded
        patches = grid_t * frames_proc.get_number_of_image_patches(h, w, {})
        assert _video_tokens("qwen2-vl-2b-instruct", (w, h, frames)) == patches // 4
    # several videos and an image: one run of placeholders each
    card = est.estimate(
        "qwen2-vl-2b-instruct",
        images=[(448, 448)],
        videos=[(448, 448, 4), (448, 448, 2)],
        prompt_tokens=8,
        new_tokens=1,
    )
    assert card.tokens["vision"] == 256 + 2 * 256 + 256


def test_llava_video_families_like_their_processors() -> None:
    from types import SimpleNamespace

    import numpy as np

    # LLaVA-NeXT-Video: frames cropped to the tower's 336 px, 24 x 24 patches pooled by 2 per frame
    proc = SimpleNamespace(patch_size=14, video_token="v")
    frames = {"pixel_values_videos": [np.zeros((8, 3, 336, 336), dtype=np.float32)]}
    expected = len(transformers.LlavaNextVideoProcessor.replace_video_token(proc, frames))
    assert _video_tokens("llava-next-video-7b", (640, 480, 8)) == expected == 8 * 144
    # LLaVA-OneVision: 27 x 27 patches per 384 px frame, bilinear-pooled to 14 x 14, one newline per video
    proc = SimpleNamespace(num_image_tokens=(384 // 14) ** 2)
    counts = transformers.LlavaOnevisionProcessor._get_num_multimodal_tokens(proc, video_sizes=[(8, 480, 640)])
    assert _video_tokens("llava-onevision-qwen2-0.5b-ov", (640, 480, 8)) == counts["num_video_tokens"][0]


def test_video_requests_refused_where_not_built() -> None:
    with pytest.raises(InputError, match="video requests for model_type 'qwen3_vl'"):
        est.estimate("qwen3-vl-2b-instruct", videos=[(448, 448, 4)])
    with pytest.raises(InputError, match="frames"):
        est.estimate("qwen2-vl-2b-instruct", videos=[(448, 448, 100_000)])


def test_voxtral_audio_chunked_like_its_processor() -> None:
    from types import SimpleNamespace

    import numpy as np

    resolved, model = _meta("voxtral-mini-3b-2507")
    ac = resolved.config.audio_config
    extractor = transformers.WhisperFeatureExtractor(feature_size=ac.num_mel_bins)
    defaults = dict(transformers.VoxtralProcessor.audio_kwargs)
    window = defaults.pop("max_source_positions")
    per_window = ac.max_source_positions * ac.hidden_size // ac.intermediate_size  # 4 frames per token
    for seconds in (5.0, 30.0, 75.0):
        card = est.estimate("voxtral-mini-3b-2507", audio_seconds=seconds, prompt_tokens=4, new_tokens=1)
        # the processor's own chunking of the same clip: windows of 3000 mel frames along the batch
        features = transformers.VoxtralProcessor._retrieve_input_features(
            SimpleNamespace(feature_extractor=extractor),
            [np.zeros(int(seconds * 16000), np.float32)],
            window,
            **defaults,
        )
        assert card.tokens["audio"] == features.shape[0] * per_window
    assert est.estimate("voxtral-mini-3b-2507", prompt_tokens=4, new_tokens=1).tokens["audio"] == 0


def test_cli_video_flag(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["qwen2-vl-2b-instruct", "--video", "448x448x4", "--prompt-tokens", "4", "--new-tokens", "1", "--json"]
    assert _cli(*argv) == 0
    card = json.loads(capsys.readouterr().out)
    assert card["tokens"]["vision"] == 2 * 256  # 4 frames: 2 temporal patches of 16 x 16 merged patches
    with pytest.raises(InputError, match="WIDTHxHEIGHTxFRAMES"):
        _cli("qwen2-vl-2b-instruct", "--video", "448x448")
