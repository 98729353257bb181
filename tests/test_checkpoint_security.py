"""Hostile safetensors headers for ``memwarden estimate ./folder`` and a hostile ``--batch``: one
error line each, before anything is sized by the file."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import pytest

from memwarden.errors import InputError
from memwarden.estimation.checkpoint import MAX_HEADER_BYTES, MAX_TENSORS, read_checkpoint, read_header

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_fuzz_checkpoint as campaign  # noqa: E402
import bench_fuzz_onnx as hostile  # noqa: E402


def write(path: Path, header: dict, data_len: int) -> Path:
    path.write_bytes(hostile.safetensors_bytes(header, data_len))
    return path


def test_seed_is_read(tmp_path: Path) -> None:
    out = read_header(write(tmp_path / "m.safetensors", hostile.seed_header(), 64))
    assert out == {"a": ((4, 4), "float16", 32), "b": ((8,), "float32", 32)}


@pytest.mark.parametrize(
    ("offsets_b", "data_len", "match"),
    [
        ([16, 48], 64, "overlap"),  # b starts inside a
        ([32, 64], 63, "past the end"),
        ([-32, 0], 64, "do not hold"),  # negative
        ([64, 32], 64, "do not hold"),  # reversed
    ],
)
def test_bad_offsets_are_refused(tmp_path: Path, offsets_b: list[int], data_len: int, match: str) -> None:
    header = hostile.seed_header()
    header["b"]["data_offsets"] = offsets_b
    with pytest.raises(InputError, match=match):
        read_header(write(tmp_path / "m.safetensors", header, data_len))


def test_overlap_with_an_earlier_tensor_past_an_empty_one(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "U8", "shape": [100], "data_offsets": [0, 100]},
        "e": {"dtype": "U8", "shape": [0], "data_offsets": [10, 10]},
        "c": {"dtype": "U8", "shape": [10], "data_offsets": [50, 60]},
    }
    with pytest.raises(InputError, match="overlap"):
        read_header(write(tmp_path / "m.safetensors", header, 100))


def test_shape_the_file_cannot_hold_is_refused(tmp_path: Path) -> None:
    """A 1 KB header claiming [2^39, 896] bf16 (1792 TiB) is not reported as weights."""
    n = (1 << 39) * 896 * 2
    header = {"w": {"dtype": "BF16", "shape": [1 << 39, 896], "data_offsets": [0, n]}}
    path = write(tmp_path / "m.safetensors", header, 0)
    assert path.stat().st_size < 1024
    with pytest.raises(InputError, match="past the end of the file"):
        read_header(path)


def test_header_and_tensor_count_are_bounded(tmp_path: Path) -> None:
    big = tmp_path / "big.safetensors"
    big.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}")
    with pytest.raises(InputError, match="header length"):
        read_header(big)
    many = {f"t{i}": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]} for i in range(MAX_TENSORS + 1)}
    with pytest.raises(InputError, match=f"more than {MAX_TENSORS} tensors"):
        read_header(write(tmp_path / "many.safetensors", many, 0))


def test_duplicate_keys_and_names_with_escapes(tmp_path: Path) -> None:
    raw = b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}'
    dup = tmp_path / "dup.safetensors"
    dup.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0")
    with pytest.raises(InputError, match="twice"):
        read_header(dup)
    header = {hostile.ESC: {"dtype": "F99", "shape": [1], "data_offsets": [0, 1]}}
    with pytest.raises(InputError) as info:
        read_header(write(tmp_path / "esc.safetensors", header, 1))
    assert "\x1b" not in str(info.value) and "\\x1b" in str(info.value)


def test_fifo_shard_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "model.safetensors")
    with pytest.raises(InputError, match="not a regular file"):
        read_checkpoint(tmp_path)


def test_estimate_folder_with_a_hostile_shard_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memwarden.cli import main
    from memwarden.estimation.resolve import CONFIG_DIR

    header = hostile.seed_header()
    header["b"]["data_offsets"] = [16, 48]
    folder = tmp_path / "ckpt"
    folder.mkdir()
    write(folder / "model.safetensors", header, 64)
    (folder / "config.json").write_text((CONFIG_DIR / "qwen2-vl-2b-instruct.json").read_text())
    status = main(["estimate", str(folder)])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "overlap" in err


@pytest.mark.parametrize("batch", ["1000000", "0", "-3", "4097"])
def test_batch_is_bounded(batch: str, capsys: pytest.CaptureFixture[str]) -> None:
    from memwarden.cli import main

    assert main(["estimate", "qwen2-vl-2b-instruct", "--batch", batch]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--batch" in err and "1 to 4096" in err


# -- the structured fuzz campaign (benchmarks/bench_fuzz_checkpoint.py), a bounded budget ------------


def test_fuzz_campaign_short_run() -> None:
    """A short run of the checkpoint-folder campaign through ``memwarden estimate``: no traceback,
    no hang (a 120 s watchdog: a guard, not a timing), no escape sequence on the terminal."""
    report = campaign.run(40, seed=7, hang_s=120)
    assert report["tracebacks"] == report["hangs"] == report["escape_leaks"] == 0, report["examples"]
    assert sum(report["outcomes"].values()) == 40


@pytest.mark.parametrize(
    ("field", "value"),
    [("rms_norm_eps", "[/bold]"), ("torch_dtype", hostile.ESC), ("num_attention_heads", hostile.ESC)],
)
def test_config_transformers_rejects_is_one_safe_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: str
) -> None:
    from memwarden.cli import main

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**campaign.CONFIG, field: value}))
    status = main(["estimate", str(folder), "--no-suggest"])
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and "\x1b" not in err, err
