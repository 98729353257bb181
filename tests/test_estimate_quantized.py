"""Quantized checkpoints as they are loaded, and local checkpoint folders read from their
safetensors headers only.

The checkpoints here are written with the published tensor names and shapes of each method
(the shapes are spelled out below from the methods' sources, independently of
``memwarden.estimation.quantized``): an estimate from ``config.json`` alone must hold exactly the
bytes of the checkpoint, and an estimate of the folder exactly its headers' sum, without reading
any tensor data (the files are cut off right after their headers)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from _safetensors_files import write_header_only
from _shrink import tiny_config
from memwarden.errors import InputError
from memwarden.estimation.checkpoint import read_header
from memwarden.estimation.resolve import CONFIG_DIR
from memwarden.estimation.run import estimate


def _tiny(name: str, **extra: Any) -> dict[str, Any]:
    data = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    data = {k: v for k, v in tiny_config(data, 56).items() if not k.startswith(("_memwarden", "_source"))}
    return {**data, **extra}


def _dense_state(config: dict[str, Any]) -> tuple[dict[str, tuple[tuple[int, ...], str]], set[str], int]:
    """(checkpoint key -> (shape, dtype) as save_pretrained writes it, Linear module paths,
    bytes of the non-persistent buffers the model computes at load)."""
    cfg = transformers.AutoConfig.for_model(**config)
    cls = getattr(transformers, config["architectures"][0])
    with torch.device("meta"):
        model = cls._from_config(cfg, dtype=torch.float16)
    tied = set(model.all_tied_weights_keys)  # save_pretrained drops tied duplicates
    state = {
        k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in model.state_dict().items() if k not in tied
    }
    linears = {p for p, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    persistent = set(model.state_dict())
    computed = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n not in persistent)
    computed += sum(  # plain tensor attributes the capture also holds (a rotary embedding's original_inv_freq)
        v.numel() * v.element_size() for m in model.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)
    )
    return state, linears, computed


def test_folder_weights_are_the_headers_sum_and_no_data_is_read(tmp_path: Path) -> None:
    config = _tiny("qwen2-vl-2b-instruct", torch_dtype="float16")
    state, _linears, computed = _dense_state(config)
    # mixed precision: the vision tower in float32, the rest float16
    state = {k: (s, "float32" if k.startswith("model.visual") else d) for k, (s, d) in state.items()}
    keys = sorted(state)
    half = len(keys) // 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    total = write_header_only(tmp_path / "model-00001-of-00002.safetensors", {k: state[k] for k in keys[:half]})
    total += write_header_only(tmp_path / "model-00002-of-00002.safetensors", {k: state[k] for k in keys[half:]})
    card = estimate(str(tmp_path), prompt_tokens=8, new_tokens=2)
    assert card.quantization is not None and card.quantization["checkpoint_bytes"] == total
    assert card.weights_bytes == total + computed
    assert card.quantization["method"] is None


def test_folder_with_pickles_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_tiny("qwen2-vl-2b-instruct")))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not read")
    with pytest.raises(InputError, match="pickle"):
        estimate(str(tmp_path), prompt_tokens=8, new_tokens=2)


def test_bad_header_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(struct.pack("<Q", 1 << 40))
    with pytest.raises(InputError, match="header length"):
        read_header(bad)
    raw = json.dumps({"w": {"dtype": "F16", "shape": [4, 4], "data_offsets": [0, 31]}}).encode()
    bad.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(InputError, match="data_offsets"):
        read_header(bad)


# -- the methods' published layouts ----------------------------------------------------------------


def _awq_gemm(i: int, o: int, g: int) -> dict[str, tuple[tuple[int, ...], str]]:
    # AutoAWQ awq/modules/linear/gemm.py WQLinear_GEMM.__init__ (pack_num = 32 // w_bit = 8)
    return {
        "qweight": ((i, o // 8), "int32"),
        "qzeros": ((i // g, o // 8), "int32"),
        "scales": ((i // g, o), "float16"),
    }


def _gptq(i: int, o: int, g: int) -> dict[str, tuple[tuple[int, ...], str]]:
    # auto-gptq nn_modules/qlinear/qlinear_cuda_old.py QuantLinear.__init__ (4 bits)
    return {
        "qweight": ((i // 32 * 4, o), "int32"),
        "qzeros": ((math.ceil(i / g), o // 32 * 4), "int32"),
        "scales": ((math.ceil(i / g), o), "float16"),
        "g_idx": ((i,), "int32"),
    }


def _nf4_dq(i: int, o: int, _g: int) -> dict[str, tuple[tuple[int, ...], str]]:
    # bitsandbytes functional.py QuantState.as_dict(packed=True) with compress_statistics (blocksize 64)
    n = i * o
    return {
        "weight": ((n // 2, 1), "uint8"),
        "weight.absmax": ((n // 64,), "uint8"),
        "weight.quant_map": ((16,), "float32"),
        "weight.nested_absmax": ((math.ceil(n / 64 / 256),), "float32"),
        "weight.nested_quant_map": ((256,), "float32"),
    }


def _ct_fp8(i: int, o: int, _g: int) -> dict[str, tuple[tuple[int, ...], str]]:
    # compressed-tensors float-quantized, channel strategy (llm-compressor FP8_DYNAMIC): scale in the model dtype
    return {"weight": ((o, i), "float8_e4m3fn"), "weight_scale": ((o, 1), "float16")}


def _ct_w4a16(i: int, o: int, g: int) -> dict[str, tuple[tuple[int, ...], str]]:
    # compressed-tensors pack-quantized (W4A16, symmetric, group): 8 codes per int32
    return {
        "weight_packed": ((o, i // 8), "int32"),
        "weight_scale": ((o, i // g), "float16"),
        "weight_shape": ((2,), "int64"),
    }


_FP8_SCHEME = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}
_W4_SCHEME = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": True}
# method -> (quantization_config, layout of one Linear, which Linear modules the loader converts)
CASES = {
    "awq": (
        {
            "quant_method": "awq",
            "bits": 4,
            "group_size": 32,
            "version": "gemm",
            "zero_point": True,
            "modules_to_not_convert": ["visual"],
        },
        _awq_gemm,
        lambda p: p.startswith("model.language_model."),
    ),
    "gptq": (
        {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": True},
        _gptq,
        lambda p: p.startswith("model.language_model.layers."),
    ),
    "bnb-nf4": (
        {
            "quant_method": "bitsandbytes",
            "load_in_4bit": True,
            "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": True,
            "llm_int8_skip_modules": ["lm_head", "visual.merger"],
        },
        _nf4_dq,
        lambda p: p != "lm_head" and ".merger." not in p,
    ),
    "ct-fp8": (
        {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "ignore": ["lm_head", "re:visual.*"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": _FP8_SCHEME}},
        },
        _ct_fp8,
        lambda p: p.startswith("model.language_model."),
    ),
    "ct-w4a16": (
        {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "ignore": ["lm_head", "re:visual.*"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": _W4_SCHEME}},
        },
        _ct_w4a16,
        lambda p: p.startswith("model.language_model."),
    ),
}


def _checkpoint_key(path: str) -> str:
    """The key a pre-transformers-5 Qwen2-VL checkpoint uses for a module path."""
    if path.startswith("model.language_model."):
        return "model." + path.removeprefix("model.language_model.")
    return path.removeprefix("model.")


@pytest.mark.parametrize("method", sorted(CASES))
def test_quantized_layout_holds_the_checkpoint_bytes(tmp_path: Path, method: str) -> None:
    qc, layout, converts = CASES[method]
    config = _tiny("qwen2-vl-2b-instruct", torch_dtype="float16", quantization_config=qc)
    dense, linears, computed = _dense_state(config)
    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = getattr(transformers, config["architectures"][0])._from_config(cfg, dtype=torch.float16)
    tensors: dict[str, tuple[tuple[int, ...], str]] = {}
    for key, spec in dense.items():
        module = key.rsplit(".", 1)[0]
        if module in linears and converts(module):
            if key.endswith(".weight"):
                lin = model.get_submodule(module)
                for name, s in layout(lin.in_features, lin.out_features, 32).items():
                    tensors[f"{_checkpoint_key(module)}.{name}"] = s
                continue
            spec = (spec[0], "float16")  # the bias of a quantized Linear
        tensors[_checkpoint_key(key)] = spec
    (tmp_path / "config.json").write_text(json.dumps(config))
    total = write_header_only(tmp_path / "model.safetensors", tensors)
    from_config = estimate(str(tmp_path / "config.json"), prompt_tokens=8, new_tokens=2)
    assert from_config.weights_bytes == total + computed, (from_config.weights_bytes - computed, total)
    assert from_config.quantization is not None and from_config.quantization["converted_linears"] > 0
    from_folder = estimate(str(tmp_path), prompt_tokens=8, new_tokens=2)
    assert from_folder.weights_bytes == total + computed
    assert from_folder.quantization is not None
    assert from_folder.quantization["converted_linears"] == from_config.quantization["converted_linears"]


def test_unknown_method_is_refused_not_ignored(tmp_path: Path) -> None:
    config = _tiny("qwen2-vl-2b-instruct", quantization_config={"quant_method": "no-such-method"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="not emulated"):
        estimate(str(tmp_path / "config.json"), prompt_tokens=8, new_tokens=2)


def test_weights_dtype_on_a_quantized_checkpoint_is_refused(tmp_path: Path) -> None:
    config = _tiny("qwen2-vl-2b-instruct", quantization_config=CASES["awq"][0])
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="weights-dtype"):
        estimate(str(tmp_path / "config.json"), prompt_tokens=8, new_tokens=2, weights_dtype="int4")


@pytest.mark.parametrize(("version", "vision_kept"), [("4.57.1", True), (None, True), ("5.24.0", False)])
def test_skip_lists_match_as_the_transformers_that_saved_the_config(
    tmp_path: Path, version: str | None, vision_kept: bool
) -> None:
    """``llm_int8_skip_modules: ["visual"]`` names the vision tower in a checkpoint saved before
    transformers 5 (its keys were ``visual.``); transformers 5 matches skip lists against its own
    module paths (``model.visual.``, quantizers_utils.should_convert_module: from the start or as a
    suffix), so in a config it saved, "visual" keeps nothing and the tower is quantized."""
    qc = {
        "quant_method": "bitsandbytes",
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "llm_int8_skip_modules": ["lm_head", "visual"],
    }
    config = _tiny("qwen2-vl-2b-instruct", torch_dtype="float16", quantization_config=qc)
    if version is not None:
        config["transformers_version"] = version
    (tmp_path / "config.json").write_text(json.dumps(config))
    card = estimate(str(tmp_path / "config.json"), prompt_tokens=8, new_tokens=2)
    assert card.quantization is not None
    kept = card.quantization["unquantized"].get("llm_int8_skip_modules", [])
    assert any(p.startswith("model.visual.") for p in kept) == vision_kept, kept
    assert "lm_head" in kept
