"""``memwarden estimate MODEL.gguf``: llama.cpp's buffers from tiny real GGUF files (written by
the gguf package's GGUFWriter, as llama.cpp's converter writes them), against figures computed by
hand from llama.cpp's rules; damaged and hostile headers give one line and a non-zero exit."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from memwarden.cli import main
from memwarden.errors import InputError
from memwarden.estimation.gguf.estimate import estimate_gguf
from memwarden.estimation.gguf.mmproj import image_tokens, preserved_ratio, projector
from memwarden.estimation.gguf.reader import read_header

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType


def _tensor(w: object, name: str, shape: tuple[int, ...], qtype: object | None) -> None:
    """A zero tensor of ggml shape ``shape`` (ne[0] first): f32 vectors, f16 matrices, or the raw
    blocks of ``qtype`` (every ggml type, whether or not the gguf package can quantize to it)."""
    if qtype is not None and len(shape) > 1:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        rows = int(np.prod(shape[1:]))
        w.add_tensor(name, np.zeros((rows, shape[0] // block * size), dtype=np.uint8), raw_dtype=qtype)  # type: ignore[attr-defined]
    else:
        arr = np.zeros(shape[::-1], dtype=np.float32)
        w.add_tensor(name, arr.astype(np.float16) if len(shape) > 1 else arr)  # type: ignore[attr-defined]


def write_lm(
    path: Path,
    *,
    arch: str = "llama",
    n_layer: int = 2,
    d: int = 64,
    heads: int = 2,
    kv_heads: int = 1,
    ff: int = 128,
    vocab: int = 1000,
    qtype: object | None = None,
    sliding_window: int = 0,
) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(2048)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    if sliding_window:
        w.add_sliding_window(sliding_window)
    w.add_token_list([f"t{i}" for i in range(vocab)])
    kv_dim = d // heads * kv_heads
    _tensor(w, "token_embd.weight", (d, vocab), qtype)
    for il in range(n_layer):
        _tensor(w, f"blk.{il}.attn_norm.weight", (d,), None)
        for name, shape in (
            ("attn_q", (d, d)),
            ("attn_k", (d, kv_dim)),
            ("attn_v", (d, kv_dim)),
            ("attn_output", (d, d)),
            ("ffn_gate", (d, ff)),
            ("ffn_up", (d, ff)),
            ("ffn_down", (ff, d)),
        ):
            _tensor(w, f"blk.{il}.{name}.weight", shape, qtype)
        _tensor(w, f"blk.{il}.ffn_norm.weight", (d,), None)
    _tensor(w, "output_norm.weight", (d,), None)
    _tensor(w, "output.weight", (d, vocab), qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_mmproj(
    path: Path,
    proj_type: str,
    *,
    image_size: int,
    patch_size: int,
    n_embd: int = 32,
    extra: dict[str, int] | None = None,
) -> Path:
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("clip.projector_type", proj_type)
    w.add_bool("clip.has_vision_encoder", True)
    for key, value in {
        "clip.vision.image_size": image_size,
        "clip.vision.patch_size": patch_size,
        "clip.vision.embedding_length": n_embd,
        "clip.vision.feed_forward_length": 2 * n_embd,
        "clip.vision.attention.head_count": 2,
        "clip.vision.block_count": 1,
        "clip.vision.projection_dim": 64,
        **(extra or {}),
    }.items():
        w.add_uint32(key, value)
    _tensor(w, "v.patch_embd.weight", (patch_size, patch_size, 3, n_embd), None)  # f16: 2 B each
    _tensor(w, "mm.0.weight", (n_embd, 64), None)
    _tensor(w, "mm.0.bias", (64,), None)  # f32
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# The tiny model: 2 layers, n_embd 64, 2 heads of 32, 1 KV head (32 K/V values per token), FFN 128,
# 1000 tokens. F16 matrices and F32 norms, by hand:
#   token_embd and output 64 x 1000 x 2 B = 128000 each; per layer q 8192, k 4096, v 4096, o 8192,
#   gate/up/down 16384 each, two norms 256 each = 74240; output_norm 256.
F16_WEIGHTS = 128000 * 2 + 2 * 74240 + 256
# Q8_0 (34 B per 32 values): 64-wide rows are 68 B: token_embd/output 68000 each; per layer q 4352,
# k 2176, v 2176, o 4352, gate/up 8704 each, down (128-wide rows, 64 of them) 8704, norms 512.
Q8_WEIGHTS = 68000 * 2 + 2 * (4352 + 2176 * 2 + 4352 + 8704 * 3 + 512) + 256


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gguf")
    return {
        "f16": write_lm(d / "tiny-f16.gguf"),
        "q8": write_lm(d / "tiny-q8_0.gguf", qtype=Q.Q8_0),
        "q4k": write_lm(d / "tiny-q4_k.gguf", d=256, heads=4, kv_heads=2, ff=512, qtype=Q.Q4_K),
        "gemma3": write_lm(d / "gemma3.gguf", arch="gemma3", n_layer=7, sliding_window=512),
        "qwen2vl": write_mmproj(d / "mmproj-qwen2vl.gguf", "qwen2vl_merger", image_size=560, patch_size=14),
        "qwen25vl": write_mmproj(
            d / "mmproj-qwen25vl.gguf",
            "qwen2.5vl_merger",
            image_size=560,
            patch_size=14,
            extra={"clip.vision.n_wa_pattern": 8},
        ),
        "gemma3p": write_mmproj(d / "mmproj-gemma3.gguf", "gemma3", image_size=896, patch_size=14),
        "llava": write_mmproj(d / "mmproj-llava.gguf", "mlp", image_size=336, patch_size=14),
        "smolvlm": write_mmproj(
            d / "mmproj-idefics3.gguf",
            "idefics3",
            image_size=512,
            patch_size=16,
            extra={"clip.vision.projector.scale_factor": 4, "clip.vision.preproc_image_size": 1536},
        ),
    }


def test_weights_by_stored_type(files: dict[str, Path]) -> None:
    assert estimate_gguf(str(files["f16"])).weights.cpu_mapped_bytes == F16_WEIGHTS
    assert estimate_gguf(str(files["q8"])).weights.cpu_mapped_bytes == Q8_WEIGHTS
    # Q4_K: 144 B per 256 values; n_embd 256 rows are 144 B, FFN 512 rows 288 B, K/V 128 x 256 rows
    d, ff, kv, vocab = 256, 512, 128, 1000
    per_layer = 144 * d + 144 * kv * 2 + 144 * d + 144 * ff * 2 + 288 * d + 2 * 4 * d
    assert estimate_gguf(str(files["q4k"])).weights.by_type == {
        "Q4_K": 2 * 144 * vocab + 2 * (per_layer - 8 * d),
        "F32": 2 * 8 * d + 4 * d,
    }


def test_kv_cache_by_cache_type_and_padding(files: dict[str, Path]) -> None:
    m = str(files["f16"])
    # -c 1000 is padded to 1024 cells (llama_context: GGML_PAD(n_ctx, 256)); 32 K values per cell in f16
    assert estimate_gguf(m, n_ctx=1000).kv.total_bytes == 2 * 2 * 1024 * 32 * 2
    # q8_0: 32 values are one 34-byte block; q4_0: 18 bytes
    assert estimate_gguf(m, n_ctx=1024, cache_type_k="q8_0", cache_type_v="q8_0").kv.total_bytes == 2 * 2 * 1024 * 34
    mixed = estimate_gguf(m, n_ctx=1024, cache_type_k="q4_0", cache_type_v="f16")
    assert (mixed.kv.k_bytes, mixed.kv.v_bytes) == (2 * 1024 * 18, 2 * 1024 * 64)
    # --parallel 3 of 1000: 1024 / 3 = 341 per stream, padded to 512, three streams
    assert estimate_gguf(m, n_ctx=1000, n_parallel=3).kv.total_bytes == 3 * 512 * 2 * 2 * 64
    # the model's own context (2048) when -c is 0
    assert estimate_gguf(m).context.n_ctx == 2048


def test_quantized_v_needs_flash_attention(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InputError, match="flash attention"):
        estimate_gguf(str(files["f16"]), cache_type_v="q8_0", flash_attn="off")
    assert estimate_gguf(str(files["f16"]), cache_type_v="q8_0").context.flash_attn  # auto turns it on
    assert main(["estimate", str(files["f16"]), "-ctv", "q4_0", "-fa", "off"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "flash" in err
    with pytest.raises(InputError, match="accepts"):
        estimate_gguf(str(files["f16"]), cache_type_k="q2_k")


def test_sliding_window_cache_gemma3(files: dict[str, Path]) -> None:
    # 7 layers, period 6 (src/models/gemma3.cpp): layers 0-4 and 6 are windowed, layer 5 global.
    # 32 K/V values per cell, f16: 64 B per cell for K and for V.
    est = estimate_gguf(str(files["gemma3"]), n_ctx=4096)
    swa_cells = 1024  # GGML_PAD(min(4096, 512 + n_ubatch 512), 256)
    assert (est.kv.cells, est.kv.swa_cells) == (4096, swa_cells)
    assert est.kv.total_bytes == 1 * 4096 * 128 + 6 * swa_cells * 128
    small_ub = estimate_gguf(str(files["gemma3"]), n_ctx=4096, n_ubatch=128)
    assert small_ub.kv.swa_cells == 768  # GGML_PAD(512 + 128, 256)
    short = estimate_gguf(str(files["gemma3"]), n_ctx=256)
    assert short.kv.swa_cells == 256  # never more than the context
    # the window caches stay put while the global one grows with -c
    assert estimate_gguf(str(files["gemma3"]), n_ctx=8192).kv.total_bytes - est.kv.total_bytes == 4096 * 128


def test_offload_places_layers_as_llama_cpp(files: dict[str, Path]) -> None:
    m = str(files["f16"])
    one = estimate_gguf(m, n_ctx=4096, n_gpu_layers=1)  # -ngl 1: the output layer only
    assert one.weights.gpu_bytes == 128000 + 256 and one.kv.gpu_bytes == 0
    two = estimate_gguf(m, n_ctx=4096, n_gpu_layers=2)  # + the last repeating layer, with its KV
    assert two.weights.gpu_bytes == 128000 + 256 + 74240
    assert (two.kv.cpu_bytes, two.kv.gpu_bytes) == (4096 * 128, 4096 * 128)
    every = estimate_gguf(m, n_ctx=4096, n_gpu_layers=99)
    assert every.weights.cpu_mapped_bytes == 128000  # token embeddings never leave the CPU
    assert every.to_json()["llama_cpp"]["placement"]["gpu_bytes"] > 0


def test_compute_buffer_grows_as_llama_cpp_reserves(files: dict[str, Path]) -> None:
    m = str(files["f16"])
    base = estimate_gguf(m, n_ctx=4096, flash_attn="off").compute_bytes
    # the worst-case graph: one output row per token of the ubatch (logits n_vocab x n_ubatch f32)
    assert base >= 1000 * 512 * 4
    assert estimate_gguf(m, n_ctx=8192, flash_attn="off").compute_bytes > base  # KQ grows with the cache
    assert estimate_gguf(m, n_ctx=4096, n_ubatch=1024).compute_bytes > estimate_gguf(m, n_ctx=4096).compute_bytes
    assert estimate_gguf(m, n_ctx=4096, flash_attn="on").compute_bytes < base


def test_image_tokens_per_projector(files: dict[str, Path]) -> None:
    qwen = projector(read_header(files["qwen2vl"]))
    # 1000x600 -> multiples of 28 by rounding: 1008 x 588 -> 36 x 21 merged patches
    assert image_tokens(qwen, 1000, 600).tokens == 36 * 21
    # 20x20 is below 8 tokens' pixels: scaled up by ceil to 84 x 84 -> 3 x 3
    assert image_tokens(qwen, 20, 20).tokens == 9
    # 4000x3000 is above 4096 tokens' pixels: beta = sqrt(12e6 / 3211264); floor -> 2044 x 1540
    assert preserved_ratio(4000, 3000, 28, 8 * 784, 4096 * 784) == (2044, 1540)
    assert image_tokens(qwen, 4000, 3000).tokens == 73 * 55
    capped = projector(read_header(files["qwen2vl"]), image_max_tokens=256)
    assert image_tokens(capped, 4000, 3000).tokens == 18 * 13 <= 256
    assert image_tokens(projector(read_header(files["gemma3p"])), 1000, 600).tokens == 256  # (896/14)^2 / 4^2
    assert image_tokens(projector(read_header(files["llava"])), 1000, 600).tokens == 576  # (336/14)^2
    # SmolVLM: longest side to 1536 (600 -> 921, made even 922), tiles of 512: 3 x 2 + the overview,
    # each (512/16)^2 / 4^2 = 64 tokens
    smol = image_tokens(projector(read_header(files["smolvlm"])), 1000, 600)
    assert (smol.tokens, len(smol.encodes)) == (7 * 64, 7)


def test_mmproj_weights_and_warmup_compute(files: dict[str, Path]) -> None:
    qwen = projector(read_header(files["qwen2vl"]))
    # patch_embd 14 x 14 x 3 x 32 f16 = 37632, mm.0 32 x 64 f16 = 4096, bias 64 f32 = 256
    assert qwen.weights_bytes == 37632 + 4096 + 256
    assert qwen.warmup_size == 46 * 28  # set_warmup_n_tokens(46*46)
    plain = estimate_gguf(str(files["f16"]), mmproj_path=str(files["qwen2vl"]), images=((1000, 600),))
    windowed = estimate_gguf(str(files["f16"]), mmproj_path=str(files["qwen25vl"]), images=((1000, 600),))
    n = 92 * 92  # warmup patches
    # the window-mask moment (measured, tests/test_gguf_vs_llamacpp.py): the image, the m-rope positions,
    # both window indices and the f32 window_mask inputs with the mask's f16 copy
    assert windowed.mmproj_compute_bytes == 3 * 1288 * 1288 * 4 + 4 * n * 4 + 2 * (n // 4) * 4 + n * n * (4 + 2)
    # the patch embedding moment: the image, the positions, im2col (3 x 14^2 f16 per patch), conv 0's product
    assert plain.mmproj_compute_bytes == 3 * 1288 * 1288 * 4 + 4 * n * 4 + 588 * n * 2 + n * 32 * 4
    no_fa = estimate_gguf(str(files["f16"]), mmproj_path=str(files["qwen2vl"]), flash_attn="off")
    assert no_fa.mmproj_compute_bytes > (92 * 92) ** 2 * 2 * 4  # n_patches^2 x heads f32 scores


def test_json_keys_and_budget_verdict(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "estimate",
        str(files["f16"]),
        "--mmproj",
        str(files["qwen2vl"]),
        "--image",
        "1000x600",
        "--image",
        "20x20",
        "-c",
        "4096",
        "--json",
    ]
    assert main([*args, "--budget", "1GiB"]) == 0
    data = json.loads(capsys.readouterr().out)
    llama = data["llama_cpp"]
    for key in (
        "model_buffer_bytes",
        "kv_buffer_bytes",
        "compute_buffer_bytes",
        "mmproj_buffer_bytes",
        "mmproj_compute_bytes",
        "image_tokens",
        "weights_bytes",
        "kv_cache_bytes",
        "compute_bytes",
        "mmproj_weights_bytes",
    ):
        assert isinstance(llama[key], int), key
    assert llama["image_tokens"] == 36 * 21 + 9
    assert llama["weights_bytes"] == F16_WEIGHTS and llama["kv_cache_bytes"] == 4096 * 2 * 128
    assert {b["on"] for b in llama["buffers"]} == {"cpu"}
    assert data["peak_bytes"] == sum(b["bytes"] for b in llama["buffers"])
    assert data["fits"] is True
    assert main([*args, "--budget", "1MiB"]) == 1  # does not fit: exit 1, as for any estimate
    assert json.loads(capsys.readouterr().out)["fits"] is False
    assert main(["estimate", str(files["f16"]), "--budget", "1MiB", "--device-profile", "pixel-8"]) == 2
    assert main(["estimate", str(files["f16"]), "-c", "2048"]) == 0
    out = capsys.readouterr().out
    assert "KV buffer" in out and "compute buffer" in out


def test_estimate_of_a_pair_is_fast(files: dict[str, Path]) -> None:
    start = time.perf_counter()
    estimate_gguf(str(files["q8"]), mmproj_path=str(files["smolvlm"]), images=((1024, 768),), n_ctx=8192)
    assert time.perf_counter() - start < 1.0


# -- damaged and hostile headers ---------------------------------------------------------------


def _header(n_tensors: int = 0, kv: bytes = b"", n_kv: int = 0, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kv


def _kv_string(key: bytes, value: bytes, declared: int | None = None) -> bytes:
    n = len(value) if declared is None else declared
    return struct.pack("<Q", len(key)) + key + struct.pack("<I", 8) + struct.pack("<Q", n) + value


HOSTILE = {
    "empty": b"",
    "bad magic": b"GGML" + b"\0" * 40,
    "version": _header(version=99) + b"\0" * 16,
    "tensor count": _header(n_tensors=1 << 40) + b"\0" * 16,
    "kv count": _header(n_kv=1 << 40) + b"\0" * 16,
    "string length": _header(n_kv=1, kv=_kv_string(b"general.architecture", b"llama", declared=1 << 62)),
    "truncated string": _header(n_kv=1, kv=_kv_string(b"general.architecture", b"lla", declared=5)),
    "array length": _header(n_kv=1, kv=struct.pack("<Q", 3) + b"abc" + struct.pack("<IIQ", 9, 4, 1 << 60)),
    "nested array": _header(n_kv=1, kv=struct.pack("<Q", 3) + b"abc" + struct.pack("<IIQ", 9, 9, 1) + b"\0" * 16),
    "value type": _header(n_kv=1, kv=struct.pack("<Q", 3) + b"abc" + struct.pack("<I", 77) + b"\0" * 16),
    "tensor dims": _header(n_tensors=1) + struct.pack("<Q", 1) + b"t" + struct.pack("<I", 9) + b"\0" * 64,
    "tensor type": _header(n_tensors=1) + struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, 32, 999, 0),
    "tensor past the end": _header(n_tensors=1) + struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, 1 << 30, 0, 0),
    "tensor elements": _header(n_tensors=1)
    + struct.pack("<Q", 1)
    + b"t"
    + struct.pack("<IQQIQ", 2, 1 << 40, 1 << 40, 0, 0),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_header_is_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(HOSTILE[case])
    start = time.perf_counter()
    assert main(["estimate", str(path)]) == 2
    assert time.perf_counter() - start < 1.0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1, captured.err


def test_truncated_real_file(files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = files["q8"].read_bytes()
    for cut in (10, 200, 3000, len(data) - 100):
        path = tmp_path / "cut.gguf"
        path.write_bytes(data[:cut])
        assert main(["estimate", str(path)]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_not_a_regular_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", str(tmp_path / "missing.gguf")]) == 2
    (tmp_path / "dir.gguf").mkdir()
    assert main(["estimate", str(tmp_path / "dir.gguf")]) == 2
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.gguf")
        assert main(["estimate", str(tmp_path / "fifo.gguf")]) == 2  # never blocks
    assert all(line.startswith("memwarden estimate: error:") for line in capsys.readouterr().err.splitlines())


def test_projector_given_as_model_and_unknown_projector(files: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--mmproj"):
        estimate_gguf(str(files["qwen2vl"]))
    odd = write_mmproj(tmp_path / "odd.gguf", "cogvlm", image_size=224, patch_size=14)
    with pytest.raises(InputError, match="not estimated yet"):
        estimate_gguf(str(files["f16"]), mmproj_path=str(odd))


@pytest.mark.parametrize("cache", ["f16", "q8_0"])
def test_fit_finds_the_largest_context_and_the_next_step_does_not_fit(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], cache: str
) -> None:
    """``--fit BUDGET`` for a llama.cpp deployment: the answer's -c, fed back to the plain estimate
    with the same budget, fits; one llama.cpp step (256) up does not; the printed flags are the
    estimate's."""
    lm, mm = str(files["q4k"]), str(files["qwen2vl"])
    base = ["estimate", lm, "--mmproj", mm, "--image", "640x480", "-ctk", cache, "-ctv", cache, "-fa", "on"]
    full = estimate_gguf(lm, mmproj_path=mm, images=((640, 480),), cache_type_k=cache, cache_type_v=cache)
    bottom = -(-(full.image_tokens + 1) // 256) * 256  # the smallest context that holds the image
    small = estimate_gguf(
        lm, mmproj_path=mm, images=((640, 480),), cache_type_k=cache, cache_type_v=cache, n_ctx=bottom
    )
    budget = (full.peak_bytes + small.peak_bytes) // 2  # somewhere between the smallest and the whole context
    assert main([*base, "--fit", str(budget), "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["fit"]
    n = fit["value"]
    assert fit["solve"] == "context" and bottom <= n < full.context.n_ctx and n % 256 == 0
    assert fit["next_value"] == n + 256 and fit["next_judged_bytes"] > budget >= fit["judged_bytes"]
    assert main([*base, "-c", str(n), "--budget", str(budget)]) == 0
    assert main([*base, "-c", str(n + 256), "--budget", str(budget)]) == 1
    flags = fit["flags"]
    assert flags[:3] == ["llama-mtmd-cli", "-m", lm] and flags[flags.index("-c") + 1] == str(n)
    assert flags[flags.index("-ctk") + 1] == cache
    capsys.readouterr()
    assert main([*base, "--fit", str(budget)]) == 0
    text = capsys.readouterr().out
    assert f"largest context that fits: -c {n}" in text and "run: llama-mtmd-cli" in text
    # nothing fits: a clear answer and exit 1; the whole context fits: the model's own n_ctx
    assert main([*base, "--fit", "1MiB"]) == 1
    assert "does not fit at any context" in capsys.readouterr().out
    assert main([*base, "--fit", "64GiB", "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)["fit"]
    assert whole["next_value"] is None and whole["value"] == full.text.n_ctx_train


def test_fit_refuses_what_does_not_apply(files: dict[str, Path]) -> None:
    lm = str(files["f16"])
    assert main(["estimate", lm, "--fit", "1GiB", "--solve", "image"]) == 2
    assert main(["estimate", lm, "--fit", "1GiB", "--budget", "1GiB"]) == 2
    assert main(["estimate", lm, "--runtime", "transformers"]) == 2
    assert main(["estimate", "qwen2-vl-2b-instruct", "--runtime", "llama.cpp"]) == 2
