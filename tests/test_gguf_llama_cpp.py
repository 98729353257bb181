"""The GGUF estimate against the real ``llama-mtmd-cli`` (issue 42): runs only where the binary was
built (``.cache/llama.cpp-build/bin``, see docs/llama-cpp-accuracy.md) and llama.cpp's converter is
vendored beside it; CI builds neither, so this skips there. The same figures, logged once, are
checked without the binary by tests/test_gguf_vs_llamacpp.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / ".cache/llama.cpp-build/bin/llama-mtmd-cli"
VENDOR = ROOT / ".cache/llama_cpp_python-0.3.36/vendor/llama.cpp"
CONVERTED = ROOT / ".cache/llamacpp-acc"  # the benchmark's own output, reused when present

pytestmark = pytest.mark.skipif(
    not BINARY.exists() or not (VENDOR / "convert_hf_to_gguf.py").exists(),
    reason="llama-mtmd-cli is not built here (see docs/llama-cpp-accuracy.md)",
)


def _bench() -> Any:
    path = ROOT / "benchmarks/bench_llamacpp_vs_estimate.py"
    spec = importlib.util.spec_from_file_location("bench_llamacpp_vs_estimate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("cache", ["f16", "q8_0"])
def test_qwen2vl_buffers_match_llama_cpp(cache: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    bench = _bench()
    out = CONVERTED if (CONVERTED / "qwen2vl-mmproj-f16.gguf").exists() else tmp_path_factory.getbasetemp()
    folder = out / "hf-qwen2vl"
    if not (out / "qwen2vl-mmproj-f16.gguf").exists() and not folder.exists():
        bench.make_model("qwen2vl", out)
    model, mmproj = bench.convert(VENDOR, folder, False), bench.convert(VENDOR, folder, True)
    image = bench._image(out / "img-640x480.png", 640, 480)
    real, _, _ = bench.run_mtmd(bench.mtmd_command(BINARY, model, mmproj, image, 4096, cache))
    ours = bench._estimate(str(model), str(mmproj), 640, 480, 4096, cache)["llama_cpp"]
    assert ours["image_tokens"] == real["image_tokens"]
    for key in bench.KEYS[:-1]:  # llama.cpp logs MiB with two decimals
        assert abs(ours[key] - real[key]) <= max(0.03 * real[key], 0.01 * 1024 * 1024), key
