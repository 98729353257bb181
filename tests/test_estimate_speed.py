"""What makes an estimate cheap keeps its answers exact: the image processor runs once per
(processor settings, image size) and without its elementwise steps, giving the full run's keys,
shapes, dtypes and non-float values; token counts are kept by value; bad audio lengths fail with one error."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from memwarden.errors import InputError
from memwarden.estimation import request_media
from memwarden.estimation import run as est
from memwarden.estimation.card import Request
from memwarden.estimation.measure import RequestError, check_request
from memwarden.estimation.request import image_processor, placeholder_counts
from memwarden.estimation.resolve import resolve_model
from memwarden.record.meta import capture as meta


def _full_run(processor: Any, images: list[tuple[int, int]], copies: int) -> dict[str, Any]:
    blanks = [np.zeros((h, w, 3), dtype=np.uint8) for w, h in images]
    return dict(processor(images=[list(blanks) for _ in range(copies)], return_tensors="pt").items())


# shipped configs whose processors resize, tile (SmolVLM), pick an anyres grid (LLaVA-NeXT, -OneVision),
# crop into tiles (InternVL's GotOcr2), patchify flat (Qwen2-VL, GLM-4V) or pan-and-scan (Gemma 3)
CASES = [
    ("qwen2-vl-2b-instruct", None, [(448, 448)], 1),
    ("qwen2-vl-2b-instruct", 200_000, [(1920, 1080), (448, 336)], 2),
    ("glm-4.1v-9b-thinking", None, [(1000, 600)], 1),
    ("smolvlm-instruct", None, [(1536, 1536)], 1),
    ("smolvlm2-2.2b-instruct", None, [(1000, 600), (384, 384)], 2),
    ("llava-v1.6-mistral-7b", None, [(1000, 600)], 2),
    ("llava-onevision-qwen2-0.5b-ov", None, [(640, 480)], 1),
    ("llava-1.5-7b", None, [(336, 336)], 3),
    ("internvl3-1b", None, [(896, 448)], 1),
    ("gemma-3-4b-it", None, [(1200, 400)], 1),
    ("mistral-small-3.1-24b-instruct", None, [(1000, 600)], 1),
    ("idefics2-8b", None, [(980, 700)], 1),
]


@pytest.mark.parametrize(("name", "max_pixels", "images", "copies"), CASES, ids=[c[0] for c in CASES])
def test_shape_only_processing_gives_the_full_runs_outputs(
    name: str, max_pixels: int | None, images: list[tuple[int, int]], copies: int
) -> None:
    config = resolve_model(name).config
    processor = image_processor(config.model_type, config, max_pixels)
    full = _full_run(processor, images, copies)
    fast = request_media.processed(processor, images, copies)
    assert request_media._DTYPES[request_media.processor_key(processor)] is not None  # the shape-only run was used
    assert fast.keys() == full.keys()
    for key, value in full.items():
        assert isinstance(value, torch.Tensor)
        assert (fast[key].shape, fast[key].dtype) == (value.shape, value.dtype), key
        if value.is_floating_point():
            assert fast[key].is_meta  # only the shape of pixels is used
        else:  # grids, masks, sizes: the values the model reads
            assert not fast[key].is_meta and torch.equal(fast[key], value), key


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[int, int], ...]]:
    """The (W, H) sizes of every image processor run from here on."""
    calls: list[tuple[tuple[int, int], ...]] = []
    real = request_media._run_processor

    def run(processor: Any, images: list[tuple[int, int]], copies: int, **kwargs: Any) -> dict[str, Any]:
        calls.append(tuple(images))
        return real(processor, images, copies, **kwargs)

    monkeypatch.setattr(request_media, "_run_processor", run)
    return calls


def test_an_estimate_runs_the_processor_once_per_image_size(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    first = est.estimate("qwen2-vl-2b-instruct", images=[(476, 364)], prompt_tokens=4, new_tokens=1)
    # the token count and the model's inputs come from one run (beside the reference runs of a new processor)
    assert calls.count(((476, 364),)) == 1
    assert first.tokens["vision"] == (476 // 28) * (364 // 28)
    calls.clear()
    # the same size again (a --fit search's answer, a sweep, the other --new-tokens length): no run at all
    again = est.estimate("qwen2-vl-2b-instruct", images=[(476, 364)], prompt_tokens=4, new_tokens=2)
    assert calls == []
    assert again.tokens == first.tokens
    # a different pixel limit is a different processor: run again, and fewer tokens
    limited = est.estimate(
        "qwen2-vl-2b-instruct", images=[(476, 364)], prompt_tokens=4, new_tokens=1, max_pixels=100_000
    )
    assert calls.count(((476, 364),)) == 1
    assert limited.tokens["vision"] < first.tokens["vision"]


def test_processed_outputs_are_fresh_each_call() -> None:
    config = resolve_model("qwen2-vl-2b-instruct").config
    processor = image_processor(config.model_type, config)
    one = request_media.processed(processor, [(448, 448)], 1)
    one["image_grid_thw"][0, 1] = 99  # a caller that writes into its grid does not change the kept one
    two = request_media.processed(processor, [(448, 448)], 1)
    assert two["image_grid_thw"].tolist() == [[1, 32, 32]]
    assert two["pixel_values"] is not one["pixel_values"]


def test_token_counts_are_kept_by_value_not_by_object() -> None:
    resolved = resolve_model("qwen2-vl-2b-instruct")
    config = resolved.config
    a = meta.build_meta_model(config, torch.bfloat16, resolved.model_class)
    b = meta.build_meta_model(config, torch.float32, resolved.model_class)
    processor = image_processor(config.model_type, config)
    assert placeholder_counts(a, processor, [(560, 280)]) == placeholder_counts(b, processor, [(560, 280)]) == [200]
    # a config whose merger pools more: its own count, not the one kept for the other config
    other = config.__class__.from_dict(config.to_dict())
    other.vision_config.spatial_merge_size = 4
    merged = meta.build_meta_model(other, torch.bfloat16, resolved.model_class)
    processor4 = image_processor(other.model_type, other)
    assert placeholder_counts(merged, processor4, [(560, 280)]) == [(560 // 56) * (280 // 56)]


@pytest.mark.parametrize("seconds", [float("inf"), float("-inf"), float("nan"), -1.0, 0.0, True, 1e9])
def test_bad_audio_lengths_fail_with_one_clear_error(seconds: float) -> None:
    with pytest.raises(RequestError, match="audio_seconds must be a finite number of seconds") as info:
        check_request(Request(audio_seconds=seconds))
    assert isinstance(info.value, ValueError) and isinstance(info.value, InputError)
    for model in ("qwen2-audio", "qwen2-audio-7b-instruct"):  # the zoo's builder and a config's extractor
        with pytest.raises(RequestError, match="audio_seconds"):
            est.estimate(model, audio_seconds=seconds, prompt_tokens=8, new_tokens=2)


def test_the_cli_reports_a_bad_request_as_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from memwarden.cli import main

    code = main(["estimate", "qwen2-audio", "--audio-seconds", "-3", "--new-tokens", "2", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "audio-seconds must be a finite number of seconds" in err
