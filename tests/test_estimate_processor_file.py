"""A checkpoint folder's own image processor settings (preprocessor_config.json): the estimate's
image tokens equal those of transformers' processor read from the same folder, and the file is
data only (bounded values, nothing it names is imported)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import transformers

from memwarden.errors import InputError
from memwarden.estimation import run as est
from memwarden.estimation.resolve import CONFIG_DIR

# A Qwen2-VL fine-tune that caps images at 256 tokens, as its preprocessor_config.json says it
# (the legacy key names transformers still reads).
QWEN_FILE = {
    "min_pixels": 3136,
    "max_pixels": 200704,
    "patch_size": 14,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2VLProcessor",
}


def _folder(tmp_path: Path, config: str, processor: dict[str, object] | str | None) -> Path:
    folder = tmp_path / config
    folder.mkdir()
    shutil.copy(CONFIG_DIR / f"{config}.json", folder / "config.json")
    if processor is not None:
        text = processor if isinstance(processor, str) else json.dumps(processor)
        (folder / "preprocessor_config.json").write_text(text)
    return folder


def test_qwen2_vl_folder_max_pixels_like_transformers_from_pretrained(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "qwen2-vl-2b-instruct", QWEN_FILE)
    reference = transformers.Qwen2VLImageProcessorPil.from_pretrained(str(folder))  # transformers reads the file
    w, h = 1920, 1080
    expected = reference.get_number_of_image_patches(h, w, {}) // 4  # 2x2 patches merge into one token
    card = est.estimate(str(folder), images=[(w, h)], prompt_tokens=4, new_tokens=1)
    assert card.tokens["vision"] == expected <= 256
    assert card.processor == "checkpoint" and card.to_json()["processor"] == "checkpoint"
    assert any("preprocessor_config.json" in line for line in card.provenance())
    # the class's defaults (no file): the same image is several times more tokens
    plain = est.estimate(str(CONFIG_DIR / "qwen2-vl-2b-instruct.json"), images=[(w, h)], prompt_tokens=4, new_tokens=1)
    assert plain.tokens["vision"] > 4 * expected and plain.processor == "defaults"
    # --max-pixels still applies on top of the file, as processor(..., max_pixels=) would
    smaller = transformers.Qwen2VLImageProcessorPil.from_pretrained(str(folder), max_pixels=50176)
    capped = est.estimate(str(folder), images=[(w, h)], prompt_tokens=4, new_tokens=1, max_pixels=50176)
    assert capped.tokens["vision"] == smaller.get_number_of_image_patches(h, w, {}) // 4 < expected
    # a config.json path finds the file beside it
    beside = est.estimate(str(folder / "config.json"), images=[(w, h)], prompt_tokens=4, new_tokens=1)
    assert beside.tokens["vision"] == expected


def test_smolvlm_folder_tiles_like_transformers_from_pretrained(tmp_path: Path) -> None:
    settings = {"size": {"longest_edge": 1024}, "max_image_size": {"longest_edge": 512}, "do_image_splitting": True}
    folder = _folder(tmp_path, "smolvlm-256m-instruct", settings)
    reference = transformers.Idefics3ImageProcessorPil.from_pretrained(str(folder))
    config = transformers.AutoConfig.from_pretrained(str(folder))
    vc = config.vision_config
    per_tile = (vc.image_size // vc.patch_size) ** 2 // config.scale_factor**2
    for w, h in ((1536, 1536), (1000, 600)):
        tiles = reference.get_number_of_image_patches(h, w, {})[0]  # tiles + the global image
        card = est.estimate(str(folder), images=[(w, h)], prompt_tokens=8, new_tokens=1)
        assert card.tokens["vision"] == tiles * per_tile
    default = est.estimate(
        str(CONFIG_DIR / "smolvlm-256m-instruct.json"), images=[(1536, 1536)], prompt_tokens=8, new_tokens=1
    )
    assert (
        default.tokens["vision"]
        > est.estimate(str(folder), images=[(1536, 1536)], prompt_tokens=8, new_tokens=1).tokens["vision"]
    )


@pytest.mark.parametrize(
    ("processor", "message"),
    [
        ({"size": {"longest_edge": 1_000_000}, "max_image_size": {"longest_edge": 512}}, "no real processor's side"),
        ({"max_pixels": 10**15}, "beyond any processor's setting"),
        ('{"size": ', "not a readable processor config"),
        ("[1, 2]", "not a processor config"),
        ({"image_mean": [float("nan")] * 3}, "not a finite number"),
    ],
)
def test_hostile_processor_files_get_one_clear_error(
    tmp_path: Path, processor: dict[str, object] | str, message: str, cli: object
) -> None:
    folder = _folder(tmp_path, "smolvlm-256m-instruct", processor)
    with pytest.raises(InputError, match=message):
        est.estimate(str(folder), images=[(512, 512)], prompt_tokens=8, new_tokens=1)
    proc = cli("estimate", str(folder), "--image", "512x512", "--prompt-tokens", "8", "--new-tokens", "1")  # type: ignore[operator]
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr


def test_nothing_the_file_names_is_imported(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    folder = _folder(
        tmp_path,
        "qwen2-vl-2b-instruct",
        {
            **QWEN_FILE,
            "auto_map": {"AutoImageProcessor": "evil.EvilProcessor"},
            "image_processor_type": "EvilProcessor",
        },
    )
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\nclass EvilProcessor: pass\n")
    card = est.estimate(str(folder), images=[(448, 448)], prompt_tokens=4, new_tokens=1)
    assert card.tokens["vision"] == 448 * 448 // (28 * 28) and card.processor == "checkpoint"
    assert not marker.exists()
