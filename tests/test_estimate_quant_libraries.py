"""bitsandbytes and compressed-tensors checkpoints quantized and saved by the libraries themselves.

A tiny random-weight Qwen2-VL is quantized on CPU by each library and written to safetensors,
all of a library's cases in one child process that has it on its path (``make install`` puts
each in its own folder, apart from the project's environment, as torchao and hqq are: see
tests/test_estimate_hqq_torchao.py). The estimate, from ``config.json`` alone and from the
folder, must hold exactly the tensors the checkpoint holds once loaded:

- bitsandbytes 0.50 (CPU backend): transformers 5 ``BitsAndBytesConfig`` quantizes on load with
  ``device_map="cpu"`` and ``save_pretrained`` writes ``Linear4bit``/``Linear8bitLt`` state dicts.
  The file also holds per Linear a uint8 JSON tensor (``weight.quant_state.bitsandbytes__<type>``,
  4-bit) or a uint8 scalar (``weight_format``, 8-bit) that the loader parses and drops, so the
  estimate is the safetensors bytes less those; the child reloads every checkpoint and measures
  the tensors held, which exceed the estimate only by the fp32 ``offset`` scalar bitsandbytes'
  ``QuantState.from_dict`` makes per double-quantized Linear (4 bytes, not modelled).
- compressed-tensors 0.20: its own ``apply_quantization_config``, scales from the weights'
  min/max by its ``calculate_qparams``, ``ModelCompressor.compress_model``, then
  ``save_pretrained`` and ``ModelCompressor.update_config`` (the ``quantization_config`` as
  compressed-tensors writes it). Every tensor written is held: the estimate is the safetensors sum.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from _shrink import tiny_config
from memwarden.estimation.checkpoint import read_checkpoint
from memwarden.estimation.metamodel import forget_models
from memwarden.estimation.resolve import CONFIG_DIR
from memwarden.estimation.run import estimate

BNB_DIR = Path(sys.prefix) / "bnb"  # make install: bitsandbytes alone (--no-deps; torch, numpy, packaging are here)
CT_DIR = Path(sys.prefix) / "ct"  # make install: compressed-tensors and loguru (its one dependency not here)
HAS_BNB = (BNB_DIR / "bitsandbytes").is_dir()
HAS_CT = (CT_DIR / "compressed_tensors").is_dir()

# case -> BitsAndBytesConfig keyword arguments
BNB_CASES: dict[str, dict[str, Any]] = {
    "nf4-double-quant": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True},
    "nf4": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    "fp4-double-quant": {"load_in_4bit": True, "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": True},
    # transformers 5 matches the skip list against its own module paths (quantizers_utils.py
    # should_convert_module): "model.visual", not the pre-5 checkpoint name "visual"
    "int8-skip-visual": {"load_in_8bit": True, "llm_int8_skip_modules": ["lm_head", "model.visual"]},
}
_BNB = """
import json, sys, torch, transformers

arch, dense, out, cases = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])


def held_bytes(model):
    # every storage the loaded model holds: parameters, buffers, tensor attributes, quant states
    seen = {}

    def add(t):
        if isinstance(t, torch.Tensor):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()

    for t in list(model.parameters()) + list(model.buffers()):
        add(t)
        add(getattr(t, "SCB", None))
        qs = getattr(t, "quant_state", None)
        if qs is not None:
            for v in (qs.absmax, qs.code, qs.offset):
                add(v)
            if qs.state2 is not None:
                add(qs.state2.absmax)
                add(qs.state2.code)
    for m in model.modules():
        for v in vars(m).values():
            add(v)
    return sum(seen.values())


held = {}
for case, kwargs in cases.items():
    qc = transformers.BitsAndBytesConfig(**kwargs, bnb_4bit_compute_dtype=torch.bfloat16)
    model = getattr(transformers, arch).from_pretrained(dense, quantization_config=qc, dtype=torch.bfloat16,
                                                        device_map="cpu")
    model.save_pretrained(f"{out}/{case}")
    held[case] = held_bytes(getattr(transformers, arch).from_pretrained(f"{out}/{case}", device_map="cpu"))
json.dump(held, open(f"{out}/held.json", "w"))
"""

# case -> (compressed-tensors preset scheme, weight argument overrides, ignore list)
_RAGGED = r"re:.*(qkv|attn\.proj|fc1|[qkvo]_proj|gate_proj|up_proj)$"  # in_features 64: not a multiple of 128
CT_CASES: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "fp8-dynamic": ("FP8_DYNAMIC", {}, ["lm_head"]),  # float-quantized, per channel
    "fp8-static": ("FP8", {}, ["lm_head"]),  # per tensor, input_scale stored
    "w8a8-int": ("W8A8", {}, ["lm_head"]),  # int-quantized, per channel
    "w4a16-group128": ("W4A16", {}, ["lm_head", _RAGGED]),  # pack-quantized
    "w4a16-asym-group32": ("W4A16_ASYM", {"group_size": 32}, ["lm_head"]),  # packed zero points
}
_CT = """
import json, sys, torch, transformers
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (QuantizationConfig, QuantizationStrategy, apply_quantization_config,
                                             preset_name_to_scheme)
from compressed_tensors.quantization.utils.helpers import calculate_qparams

arch, dense, out, cases = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
for case, (preset, weights, ignore) in cases.items():
    model = getattr(transformers, arch).from_pretrained(dense, dtype=torch.bfloat16)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    scheme.weights = scheme.weights.model_copy(update=weights)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=ignore))
    for module in model.modules():  # calibrate the weights' scales as an observer would: min/max
        args = getattr(getattr(module, "quantization_scheme", None), "weights", None)
        if args is None:
            continue
        w = module.weight.data.float()  # (out, in)
        if args.strategy == QuantizationStrategy.GROUP:
            padded = -(-w.shape[1] // args.group_size) * args.group_size
            g = torch.nn.functional.pad(w, (0, padded - w.shape[1])).reshape(w.shape[0], -1, args.group_size)
            lo, hi = g.amin(-1), g.amax(-1)  # (out, groups)
        elif args.strategy == QuantizationStrategy.CHANNEL:
            lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)  # (out, 1)
        else:
            lo, hi = w.amin().reshape(1), w.amax().reshape(1)
        scale, zero = calculate_qparams(lo, hi, args)
        module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))
        if hasattr(module, "input_scale"):
            module.input_scale.data.fill_(0.01)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(f"{out}/{case}")
    compressor.update_config(f"{out}/{case}")
"""


def _config() -> dict[str, Any]:
    data = json.loads((CONFIG_DIR / "qwen2-vl-2b-instruct.json").read_text())
    data = {k: v for k, v in tiny_config(data, 56).items() if not k.startswith(("_memwarden", "_source"))}
    return {**data, "torch_dtype": "bfloat16"}


def _computed_bytes(config: dict[str, Any]) -> int:
    """Bytes the model computes at load (non-persistent buffers, tensor attributes): in the
    estimate's weights but in no checkpoint."""
    cfg = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "quantization_config"})
    with torch.device("meta"):
        model = getattr(transformers, config["architectures"][0])._from_config(cfg, dtype=torch.bfloat16)
    persistent = set(model.state_dict())
    total = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n not in persistent)
    return total + sum(
        v.numel() * v.element_size() for m in model.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)
    )


def _estimates(folder: Path) -> tuple[dict[str, Any], int, int, Any]:
    """(config, weights_bytes from config.json, from the folder, the folder card's quantization)."""
    config = json.loads((folder / "config.json").read_text())
    # Both resolve to the same config.json, which is the meta-model cache's key: without a clean
    # cache the second estimate would reuse the first one's model.
    forget_models()
    from_config = estimate(str(folder / "config.json"), prompt_tokens=8, new_tokens=2)
    forget_models()
    from_folder = estimate(str(folder), prompt_tokens=8, new_tokens=2)
    forget_models()
    q = from_config.quantization
    assert q is not None and q["method"] == (from_folder.quantization or {}).get("method")
    assert q["converted_linears"] == (from_folder.quantization or {}).get("converted_linears")
    return config, from_config.weights_bytes, from_folder.weights_bytes, q


def _quantize(script: str, library: Path, out: Path, cases: dict[str, Any], dense: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(library), os.environ.get("PYTHONPATH")) if p)}
    arch = _config()["architectures"][0]
    proc = subprocess.run(
        [sys.executable, "-c", script, arch, str(dense), str(out), json.dumps(cases)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def dense_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("dense")
    config = _config()
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(**config)
    getattr(transformers, config["architectures"][0])._from_config(cfg, dtype=torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bnb_checkpoints(tmp_path_factory: pytest.TempPathFactory, dense_bf16: Path) -> Path:
    out = tmp_path_factory.mktemp("bnb")
    _quantize(_BNB, BNB_DIR, out, BNB_CASES, dense_bf16)
    return out


@pytest.fixture(scope="module")
def ct_checkpoints(tmp_path_factory: pytest.TempPathFactory, dense_bf16: Path) -> Path:
    out = tmp_path_factory.mktemp("ct")
    _quantize(_CT, CT_DIR, out, CT_CASES, dense_bf16)
    return out


@pytest.mark.skipif(not HAS_BNB, reason=f"bitsandbytes is not in {BNB_DIR} (make install puts it there)")
@pytest.mark.parametrize("case", sorted(BNB_CASES))
def test_bitsandbytes_checkpoint_written_by_bitsandbytes(bnb_checkpoints: Path, case: str) -> None:
    folder = bnb_checkpoints / case
    config, from_config, from_folder, q = _estimates(folder)
    stored = read_checkpoint(folder)
    assert stored is not None
    dropped = {
        k: n for k, n in stored.nbytes.items() if ".quant_state.bitsandbytes__" in k or k.endswith(".weight_format")
    }
    assert len(dropped) == q["converted_linears"]  # one metadata tensor per quantized Linear
    computed = _computed_bytes(config)
    held = json.loads((bnb_checkpoints / "held.json").read_text())[case]
    double_quant = BNB_CASES[case].get("bnb_4bit_use_double_quant", False)
    print(
        f"{case}: safetensors {stored.total_bytes} B, less {sum(dropped.values())} B of loader metadata; "
        f"estimate {from_config - computed} B (config) {from_folder - computed} B (folder); "
        f"held after load {held - computed} B, + {computed} B computed at load"
    )
    # A folder's estimate is its headers' sum (issue 26: "equals the headers' sum exactly"); the
    # config alone has no metadata tensors, whose JSON (a float offset among it) only the file
    # knows, so it is what the loader holds, less the fp32 offset per double-quantized Linear.
    assert from_folder == stored.total_bytes + computed
    assert from_config == stored.total_bytes - sum(dropped.values()) + computed
    assert held == from_config + (4 * q["converted_linears"] if double_quant else 0)  # QuantState.offset
    assert q["method"] == ("bitsandbytes-8bit" if "int8" in case else "bitsandbytes-4bit")
    if case == "int8-skip-visual":  # llm_int8_skip_modules: "model.visual" keeps the vision tower
        assert q["converted_linears"] == 14
        assert any(p.startswith("model.visual.") for p in q["unquantized"]["llm_int8_skip_modules"])
    else:  # no skip list: transformers' defaults keep the output head
        assert q["converted_linears"] == 24
        assert q["unquantized"]["output head / tied weights (kept by default)"] == ["lm_head"]


@pytest.mark.skipif(not HAS_CT, reason=f"compressed-tensors is not in {CT_DIR} (make install puts it there)")
@pytest.mark.parametrize("case", sorted(CT_CASES))
def test_compressed_tensors_checkpoint_written_by_compressed_tensors(ct_checkpoints: Path, case: str) -> None:
    folder = ct_checkpoints / case
    config, from_config, from_folder, q = _estimates(folder)
    stored = read_checkpoint(folder)
    assert stored is not None
    computed = _computed_bytes(config)
    print(
        f"{case}: safetensors {stored.total_bytes} B, estimate {from_config - computed} B (config) "
        f"{from_folder - computed} B (folder), + {computed} B computed at load"
    )
    assert from_config == from_folder == stored.total_bytes + computed
    assert q["method"] == "compressed-tensors"
    assert config["quantization_config"]["format"] in q["description"]
    # compressed-tensors writes the ignore list in the checkpoint's names (visual.blocks.0.attn.qkv,
    # model.layers.0.mlp.up_proj), not transformers 5's module paths
    assert q["converted_linears"] == (6 if case == "w4a16-group128" else 24)
