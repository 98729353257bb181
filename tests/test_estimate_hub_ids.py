"""issue 44, "Hub ids and published processors": ``estimate Qwen/Qwen2-VL-2B-Instruct`` (the id every
model card shows) is the shipped config, in any case; a near miss is told the nearest names; and a
shipped model sizes images with its published preprocessor_config.json's settings (shipped as data
in ``models/configs/processors/``), not the processor class's defaults: Qwen2-VL-2B-Instruct's
max_pixels 12845056 makes 2691 vision tokens of a 1920x1080 image where the defaults made 1222."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memwarden.errors import InputError
from memwarden.estimation.processor_file import read_processor_file
from memwarden.estimation.request import image_processor
from memwarden.estimation.resolve import CONFIG_DIR, PROCESSOR_DIR, hub_ids, model_names, resolve_model
from memwarden.estimation.run import estimate


@pytest.mark.parametrize(
    "typed",
    ["Qwen/Qwen2-VL-2B-Instruct", "qwen/qwen2-vl-2b-instruct", "QWEN/QWEN2-VL-2B-INSTRUCT", "Qwen2-VL-2B-Instruct"],
)
def test_a_hub_id_in_any_case_is_the_shipped_config_with_its_published_processor(typed: str) -> None:
    resolved = resolve_model(typed)
    assert resolved.name == "qwen2-vl-2b-instruct"
    assert resolved.source == str(CONFIG_DIR / "qwen2-vl-2b-instruct.json")
    assert resolved.processor_settings is not None
    assert {
        k: resolved.processor_settings[k]
        for k in ("min_pixels", "max_pixels", "patch_size", "merge_size", "temporal_patch_size")
    } == {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}


def test_every_hub_id_names_a_shipped_config_and_every_shipped_config_has_one() -> None:
    real = set(model_names()["real"])
    ids = hub_ids()
    assert set(ids.values()) <= real
    assert real <= set(ids.values()), f"shipped configs without a Hub id: {sorted(real - set(ids.values()))}"
    for hub, name in ids.items():
        assert resolve_model(hub.upper()).name == name
        source = json.loads((CONFIG_DIR / f"{name}.json").read_text()).get("_memwarden_source", "")
        org, _, repo = hub.partition("/")
        assert repo.lower() in source.lower() or name == "qwen2.5-omni-7b-thinker", (hub, source[:80])


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [
        ("Qwen/Qwen2-VL-2B-Instruc", "Qwen/Qwen2-VL-2B-Instruct"),
        ("qwen2vl-2b-instruct", "qwen2-vl-2b-instruct"),
        ("Qwen/Qwen2.5-VL-3B-Instruc", "Qwen/Qwen2.5-VL-3B-Instruct"),
        ("HuggingFace/SmolVLM-256M-Instruct", "HuggingFaceTB/SmolVLM-256M-Instruct"),
    ],
)
def test_a_near_miss_is_told_the_nearest_names(typed: str, suggested: str) -> None:
    with pytest.raises(InputError, match=f"unknown model '{typed}' \\(did you mean [^)]*'{suggested}'"):
        resolve_model(typed)


def test_a_name_nothing_resembles_keeps_the_plain_message() -> None:
    with pytest.raises(InputError, match="unknown model 'no-such-model'; valid names: zoo llava"):
        resolve_model("no-such-model")


def test_a_path_into_the_shipped_folder_is_not_a_name() -> None:
    with pytest.raises(InputError, match="unknown model"):
        resolve_model("processors/qwen2-vl-2b-instruct")


def test_a_local_folder_named_like_a_hub_id_is_the_users(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A download's --local-dir Qwen/Qwen2-VL-2B-Instruct holds the user's files: they come first."""
    folder = tmp_path / "Qwen" / "Qwen2-VL-2B-Instruct"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text((CONFIG_DIR / "qwen2-vl-2b-instruct.json").read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 3136, "max_pixels": 200704}))
    monkeypatch.chdir(tmp_path)
    resolved = resolve_model("Qwen/Qwen2-VL-2B-Instruct")
    assert Path(resolved.source).resolve() == (folder / "config.json").resolve()
    assert resolved.processor_settings == {"min_pixels": 3136, "max_pixels": 200704}


def _tokens(processor: Any, wh: tuple[int, int]) -> int:
    """Placeholder tokens of a W x H image by transformers' own processor: its patch grid over merge**2."""
    w, h = wh
    grid = processor(images=[np.zeros((h, w, 3), dtype=np.uint8)], return_tensors="pt")["image_grid_thw"][0]
    return int(grid.prod()) // int(processor.merge_size) ** 2


# (shipped config, tokens of a 1920x1080 image by its published processor, by the class defaults)
PUBLISHED = [
    ("qwen2-vl-2b-instruct", 2691, 1222),
    ("qwen2-vl-7b-instruct", 2691, 1222),
    ("qwen2-vl-7b-instruct-gptq-int4", 2691, 1222),
    ("qwen2-vl-2b-instruct-bnb-4bit", 2691, 1222),
    ("qwen2-vl-2b-instruct-awq", 1222, 1222),  # this release ships max_pixels 1003520, the class default
    ("qwen2-vl-2b-instruct-gptq-int4", 1222, 1222),
    ("qwen2.5-vl-3b-instruct", 2691, 1222),
    ("qwen2.5-vl-7b-instruct-fp8-dynamic", 2691, 1222),
    ("qwen2.5-omni-7b-thinker", 2691, 1222),
    ("qwen3-vl-2b-instruct", 2040, 943),  # patch 16: (1088 / 32) x (1920 / 32)
]


@pytest.mark.parametrize(("name", "published", "defaults"), PUBLISHED)
def test_shipped_processor_settings_size_images_as_the_published_processor(
    name: str, published: int, defaults: int
) -> None:
    from transformers import Qwen2VLImageProcessorPil

    resolved = resolve_model(name)
    config = resolved.config
    ours = image_processor(config.model_type, config, settings=resolved.processor_settings)
    assert _tokens(ours, (1920, 1080)) == published
    assert _tokens(image_processor(config.model_type, config), (1920, 1080)) == defaults
    # the same count by transformers' processor built from the shipped file as from_pretrained reads it
    raw = json.loads((PROCESSOR_DIR / f"{name}.json").read_text())
    kwargs = {
        k: v for k, v in raw.items() if not k.startswith("_") and k not in ("image_processor_type", "processor_class")
    }
    assert _tokens(Qwen2VLImageProcessorPil(**kwargs), (1920, 1080)) == published


def test_every_shipped_processor_file_belongs_to_a_shipped_config_and_reads() -> None:
    real = set(model_names()["real"])
    files = sorted(PROCESSOR_DIR.glob("*.json"))
    assert {p.stem for p in files} == {name for name, _, _ in PUBLISHED}
    for path in files:
        assert path.stem in real
        settings = read_processor_file(path)
        assert settings and not any(k.startswith("_") or k.endswith("_type") for k in settings)


def test_estimate_of_the_hub_id_counts_the_published_processors_2691_vision_tokens() -> None:
    card = estimate("Qwen/Qwen2-VL-2B-Instruct", images=[(1920, 1080)], prompt_tokens=16, new_tokens=1, suggest=False)
    assert card.model == "qwen2-vl-2b-instruct"
    assert card.tokens["vision"] == 2691 and card.processor == "checkpoint"
