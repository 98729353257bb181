"""The GGUF estimate against the real ``llama-mtmd-cli`` (issue 42): runs only where the binary was
built (``.cache/llama.cpp-build/bin``, see docs/estimate-accuracy.md) and llama.cpp's converter is
vendored beside it; CI builds neither, so this skips there."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / ".cache/llama.cpp-build/bin/llama-mtmd-cli"
VENDOR = ROOT / ".cache/llama_cpp_python-0.3.36/vendor/llama.cpp"

pytestmark = pytest.mark.skipif(
    not BINARY.exists() or not (VENDOR / "convert_hf_to_gguf.py").exists(),
    reason="llama-mtmd-cli is not built here (see docs/estimate-accuracy.md)",
)


def _bench() -> object:
    spec = importlib.util.spec_from_file_location("bench_gguf_estimate", ROOT / "benchmarks/bench_gguf_estimate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("cache", ["f16", "q8_0"])
def test_qwen2vl_buffers_match_llama_cpp(cache: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    from memwarden.estimation.gguf.estimate import estimate_gguf

    bench = _bench()
    out = tmp_path_factory.getbasetemp() / "gguf-real"
    out.mkdir(exist_ok=True)
    folder = out / "hf-qwen2vl"
    if not folder.exists():
        bench.make_model("qwen2vl", out)  # type: ignore[attr-defined]
    model = bench.convert(VENDOR, folder, "f16", mmproj=False)  # type: ignore[attr-defined]
    mmproj = bench.convert(VENDOR, folder, "f16", mmproj=True)  # type: ignore[attr-defined]
    image = bench._image(out / "img.png", 640, 480)  # type: ignore[attr-defined]
    real = bench.run_mtmd(BINARY, model, mmproj, image, 2048, cache, cache)  # type: ignore[attr-defined]
    assert real["rc"] == 0, real["log_tail"]
    ours = estimate_gguf(
        str(model), mmproj_path=str(mmproj), images=((640, 480),), n_ctx=2048, cache_type_k=cache, cache_type_v=cache
    ).to_json()["llama_cpp"]
    assert ours["image_tokens"] == real["image_tokens"]
    for key in ("model_buffer_bytes", "kv_buffer_bytes"):  # llama.cpp logs MiB with two decimals
        assert abs(ours[key] - real[key]) <= max(0.03 * real[key], 0.01 * 1024 * 1024), key
