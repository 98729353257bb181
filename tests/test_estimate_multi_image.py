"""Several images in one prompt, where the family's processor takes them together: LLaVA-OneVision's
tiles a lone image (its base view and anyres crops) but gives each of several only its base view,
and its model does the same (``batch_num_images``). Counted one image at a time, two 384 px images
made 2 x 1485 placeholders for 2 x 730 features, and ``estimate --image 384x384 --image 384x384``
ended in transformers' "Image features and image tokens do not match" traceback (so did
``--fit ... --solve images``)."""

from __future__ import annotations

import pytest

from memwarden.estimation.run import estimate

MODEL = "llava-onevision-qwen2-0.5b-ov"
BASE_VIEW = 27 * 27 + 1  # SigLIP's 27 x 27 patches of 384 px, and the image newline


@pytest.fixture(autouse=True)
def _no_card_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMWARDEN_ESTIMATE_CACHE", "off")  # every card measured here, none read back


def _vision(images: list[tuple[int, int]]) -> int:
    card = estimate(MODEL, images=images, prompt_tokens=16, new_tokens=1, suggest=False)
    return int(card.tokens["vision"])


def test_a_lone_image_is_tiled() -> None:
    assert _vision([(384, 384)]) > BASE_VIEW


@pytest.mark.parametrize("images", [[(384, 384)] * 2, [(384, 384), (640, 480), (200, 900)]])
def test_several_images_are_each_their_base_view(images: list[tuple[int, int]]) -> None:
    assert _vision(images) == BASE_VIEW * len(images)
