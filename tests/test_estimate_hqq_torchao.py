"""HQQ and torchao checkpoints as they are stored.

Two kinds of evidence. Where the library runs on CPU here, a tiny random-weight Qwen2-VL is
quantized by the library itself and written to safetensors; the estimate (from ``config.json``
alone and from the folder) must hold exactly the bytes of the tensors written (tied duplicates
once, as save_pretrained drops them). Where the packer needs a GPU (torchao int4), or the library
is absent, a checkpoint is written with the published tensor names and shapes, spelled out here
from the sources independently of ``memwarden.estimation.quantized_more``:

- torchao 0.18 ``quantization/quantize_/workflows/int4/int4_tensor.py`` ``Int4Tensor.from_hp``
  (``qdata`` = ``pack_int4`` of (out, in) codes, two per byte; ``scale``/``zero_point``
  (in/group, out) cast to the weight dtype) and ``int4_tile_packed_to_4d_tensor.py``
  ``Int4TilePackedTo4dTensor`` (docstring: qdata ``[n / 8][k / (inner_k_tiles * 16)][32][inner_k_tiles / 2]``,
  ``inner_k_tiles = 8``, in padded to 1024 and out to ``int4_tile_packed_ntile``;
  ``quantization/utils.py`` ``pack_tinygemm_scales_and_zeros`` -> (in/group, out, 2));
  ``prototype/safetensors/safetensors_support.py`` ``flatten_tensor_state_dict``: ``_weight_<attr>``.
- hqq 0.2.8 ``hqq/core/quantize.py`` ``Quantizer.quantize`` (reshape to (-1, group) on axis 1,
  (group, -1) on axis 0), ``core/bitpack.py`` (4-bit: rows/2 uint8; 3-bit: ceil(rows/10) int32),
  ``HQQLinear.state_dict_keys`` and ``core/utils.py`` ``encode_safetensor_type``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from _safetensors_files import write_header_only
from _shrink import tiny_config
from memwarden.errors import InputError
from memwarden.estimation.checkpoint import read_checkpoint
from memwarden.estimation.resolve import CONFIG_DIR
from memwarden.estimation.run import estimate

Spec = dict[str, tuple[tuple[int, ...], str]]


def _config(dtype: str, quantization_config: dict[str, Any] | None = None) -> dict[str, Any]:
    data = json.loads((CONFIG_DIR / "qwen2-vl-2b-instruct.json").read_text())
    data = {k: v for k, v in tiny_config(data, 56).items() if not k.startswith(("_memwarden", "_source"))}
    data["torch_dtype"] = dtype
    if quantization_config is not None:
        data["quantization_config"] = quantization_config
    return data


def _meta_model(config: dict[str, Any], dtype: torch.dtype) -> Any:
    cfg = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "quantization_config"})
    with torch.device("meta"):
        return getattr(transformers, config["architectures"][0])._from_config(cfg, dtype=dtype)


def _computed_bytes(model: Any) -> int:
    """Bytes the model computes at load (non-persistent buffers, tensor attributes): in the
    estimate's weights but in no checkpoint."""
    persistent = set(model.state_dict())
    total = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n not in persistent)
    return total + sum(
        v.numel() * v.element_size() for m in model.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)
    )


def _assert_holds_the_checkpoint(folder: Path, config: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """weights_bytes from config.json and from the folder = the safetensors tensors' bytes."""
    stored = read_checkpoint(folder)
    assert stored is not None
    computed = _computed_bytes(_meta_model(config, dtype))
    from_config = estimate(str(folder / "config.json"), prompt_tokens=8, new_tokens=2)
    from_folder = estimate(str(folder), prompt_tokens=8, new_tokens=2)
    print(
        f"{folder.name}: safetensors {stored.total_bytes} B, estimate {from_config.weights_bytes - computed} B "
        f"(config) {from_folder.weights_bytes - computed} B (folder), + {computed} B computed at load"
    )
    assert from_config.weights_bytes == stored.total_bytes + computed, (
        from_config.weights_bytes - computed,
        stored.total_bytes,
    )
    assert from_folder.weights_bytes == stored.total_bytes + computed
    q = from_config.quantization
    assert q is not None and q["method"] == config["quantization_config"]["quant_method"]
    assert q["converted_linears"] == (from_folder.quantization or {}).get("converted_linears")
    return q


# -- quantized and saved by the libraries themselves -----------------------------------------------


# torchao lives apart from the project's environment (``make install`` puts it in .venv/torchao):
# installed beside transformers it is imported by every ``import transformers`` (its quantizer
# module imports it at load), ~0.5 s and a warning per missing CUDA extension in every process.
# The checkpoints are quantized and saved in a child process that has it on its path.
TORCHAO_DIR = Path(sys.prefix) / "torchao"
HAS_TORCHAO = (TORCHAO_DIR / "torchao").is_dir()
TORCHAO_CASES = [
    "int8-weight-only",
    "int8-weight-only-group32",
    "int8-dynamic-int8",
    "float8-weight-only",
    "float8-weight-only-per-tensor",
    "intx-int4-group32",
]
_QUANTIZE = """
import sys, torch, transformers
import torchao.quantization as tq
from torchao.quantization.granularity import PerGroup, PerTensor

configs = {
    "int8-weight-only": tq.Int8WeightOnlyConfig(),
    "int8-weight-only-group32": tq.Int8WeightOnlyConfig(granularity=PerGroup(32)),
    "int8-dynamic-int8": tq.Int8DynamicActivationInt8WeightConfig(),
    "float8-weight-only": tq.Float8WeightOnlyConfig(),
    "float8-weight-only-per-tensor": tq.Float8WeightOnlyConfig(granularity=PerTensor()),
    "intx-int4-group32": tq.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
}
arch, dense, out = sys.argv[1:4]
for case in sys.argv[4:]:
    qc = transformers.TorchAoConfig(configs[case])
    model = getattr(transformers, arch).from_pretrained(dense, quantization_config=qc, dtype=torch.bfloat16,
                                                        device_map="cpu")
    model.save_pretrained(f"{out}/{case}")
"""


@pytest.fixture(scope="module")
def dense_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("dense")
    config = _config("bfloat16")
    cfg = transformers.AutoConfig.for_model(**config)
    torch.manual_seed(0)
    getattr(transformers, config["architectures"][0])._from_config(cfg, dtype=torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def torchao_checkpoints(tmp_path_factory: pytest.TempPathFactory, dense_bf16: Path) -> Path:
    """Every case quantized on load by transformers 5 with torchao on CPU and saved (one child)."""
    out = tmp_path_factory.mktemp("torchao")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(TORCHAO_DIR), os.environ.get("PYTHONPATH")) if p),
    }
    arch = _config("bfloat16")["architectures"][0]
    proc = subprocess.run(
        [sys.executable, "-c", _QUANTIZE, arch, str(dense_bf16), str(out), *TORCHAO_CASES],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.skipif(not HAS_TORCHAO, reason=f"torchao is not in {TORCHAO_DIR} (make install puts it there)")
@pytest.mark.parametrize("case", TORCHAO_CASES)
def test_torchao_checkpoint_written_by_torchao(torchao_checkpoints: Path, case: str) -> None:
    """transformers 5 quantizes on load with torchao on CPU and saves the flattened subclasses."""
    folder = torchao_checkpoints / case
    config = json.loads((folder / "config.json").read_text())
    q = _assert_holds_the_checkpoint(folder, config, torch.bfloat16)
    assert "torchao" in q["description"]
    assert "lm_head" in q["unquantized"].get("output head / tied weights (kept by default)", [])


HQQ_DIR = Path(sys.prefix) / "hqq"  # make install: hqq (built without CUDA), einops, termcolor, apart
HAS_HQQ = (HQQ_DIR / "hqq").is_dir()
HQQ_CASES = [(4, 64, 1), (3, 64, 0), (2, None, 1)]
_HQQ_QUANTIZE = """
import json, sys, torch, transformers
from hqq.core.quantize import BaseQuantizeConfig, HQQLinear
from safetensors.torch import save_file

for folder in sys.argv[1:]:
    config = json.load(open(f"{folder}/config.json"))
    quant = config["quantization_config"]["quant_config"]
    cfg = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "quantization_config"})
    torch.manual_seed(0)
    model = getattr(transformers, config["architectures"][0])._from_config(cfg, dtype=torch.float16)
    for path, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear) and "lm_head" not in path:
            model.set_submodule(path, HQQLinear(module, quant, compute_dtype=torch.float16, device="cpu"))
    tied = set(model.all_tied_weights_keys)
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k not in tied}, f"{folder}/model.safetensors")
"""


@pytest.fixture(scope="module")
def hqq_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int | None, int], Path]:
    """hqq's own ``HQQLinear`` quantizes every Linear on CPU (transformers 5.24's HQQ quantizer
    cannot: ``get_quantize_ops`` raises NotImplementedError), selected as transformers 4.x's
    ``HqqHfQuantizer.create_quantized_param`` does (skip_modules by substring), and the model's
    state dict (HQQLinear's encoded one) is written as save_pretrained writes it; in one child
    process with hqq on its path."""
    root = tmp_path_factory.mktemp("hqq")
    folders = {}
    for nbits, group, axis in HQQ_CASES:
        quant = {
            "weight_quant_params": {
                "nbits": nbits,
                "channel_wise": True,
                "group_size": group,
                "optimize": True,
                "round_zero": nbits == 4,
                "axis": axis,
                "view_as_float": False,
            },
            "scale_quant_params": None,
            "zero_quant_params": None,
            "offload_meta": False,
        }
        config = _config("float16", {"quant_method": "hqq", "quant_config": quant, "skip_modules": ["lm_head"]})
        folder = root / f"hqq-{nbits}-{group}-{axis}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        folders[(nbits, group, axis)] = folder
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(HQQ_DIR), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(
        [sys.executable, "-c", _HQQ_QUANTIZE, *map(str, folders.values())],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folders


@pytest.mark.skipif(not HAS_HQQ, reason=f"hqq is not in {HQQ_DIR} (make install builds it there, without CUDA)")
@pytest.mark.parametrize(("nbits", "group", "axis"), HQQ_CASES)
def test_hqq_checkpoint_written_by_hqq(
    hqq_checkpoints: dict[tuple[int, int | None, int], Path], nbits: int, group: int | None, axis: int
) -> None:
    folder = hqq_checkpoints[(nbits, group, axis)]
    config = json.loads((folder / "config.json").read_text())
    q = _assert_holds_the_checkpoint(folder, config, torch.float16)
    assert q["description"].startswith(f"HQQ {nbits}-bit")
    assert q["converted_linears"] == 24


# -- published layouts, where the packer needs a GPU or the library is absent ---------------------------


def _int4_plain(i: int, o: int, g: int, dtype: str) -> Spec:
    return {
        "_weight_qdata": ((o, i // 2), "int8"),
        "_weight_scale": ((i // g, o), dtype),
        "_weight_zero_point": ((i // g, o), dtype),
    }


def _int4_tile(i: int, o: int, g: int, _dtype: str) -> Spec:
    k, n = math.ceil(i / 1024) * 1024, math.ceil(o / 8) * 8
    return {
        "_weight_qdata": ((n // 8, k // (8 * 16), 32, 8 // 2), "int32"),
        "_weight_scale_and_zero": ((k // g, n, 2), "bfloat16"),
    }


def _hqq_meta(dtype: str) -> Spec:
    ints = {k: ((), "int32") for k in ("nbits", "group_size", "axis")}
    flags = {
        k: ((), "uint8")
        for k in (
            "view_as_float",
            "quant_scale",
            "quant_zero",
            "offload_meta",
            "encoded_state_dict",
            "stores_quant_config",
            "channel_wise",
            "optimize",
            "round_zero",
        )
    }
    strings = {
        "packing": ((7,), "uint8"),
        "unpack_view_dtype": ((11,), "uint8"),
        "compute_dtype": ((len(f"torch.{dtype}"),), "uint8"),
    }
    return {**ints, **flags, **strings, "shape": ((2,), "int64")}


def _hqq4_axis1(i: int, o: int, g: int, dtype: str) -> Spec:
    return {
        "W_q": ((o * i // g // 2, g), "uint8"),
        "scale": ((o * i // g, 1), dtype),
        "zero": ((o * i // g, 1), dtype),
        **_hqq_meta(dtype),
    }


def _hqq3_axis0(i: int, o: int, g: int, dtype: str) -> Spec:
    return {
        "W_q": ((math.ceil(g / 10), o * i // g), "int32"),
        "scale": ((1, o * i // g), dtype),
        "zero": ((1, o * i // g), dtype),
        **_hqq_meta(dtype),
    }


def _ao(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "quant_method": "torchao",
        "modules_to_not_convert": None,
        "include_input_output_embeddings": False,
        "untie_embedding_weights": False,
        "quant_type": {"default": {"_type": kind, "_version": 2, "_data": data}},
    }


def _hqq(nbits: int, axis: int) -> dict[str, Any]:
    wqp = {
        "nbits": nbits,
        "channel_wise": True,
        "group_size": 32,
        "optimize": True,
        "round_zero": False,
        "axis": axis,
        "view_as_float": False,
    }
    return {
        "quant_method": "hqq",
        "skip_modules": ["lm_head"],
        "quant_config": {
            "weight_quant_params": wqp,
            "scale_quant_params": None,
            "zero_quant_params": None,
            "offload_meta": False,
        },
    }


_PLAIN = {"_type": "Int4PackingFormat", "_data": "PLAIN"}
# case -> (model dtype, quantization_config, layout of one Linear, bias dtype of a quantized Linear)
LAYOUTS = {
    "torchao-int4-plain": (
        "bfloat16",
        _ao("Int4WeightOnlyConfig", {"group_size": 32, "int4_packing_format": _PLAIN}),
        _int4_plain,
    ),
    "torchao-int4-tile": (
        "bfloat16",
        _ao(
            "Int4WeightOnlyConfig",
            {"group_size": 32, "int4_packing_format": "tile_packed_to_4d", "int4_tile_packed_ntile": 8},
        ),
        _int4_tile,
    ),
    "hqq-4bit-axis1": ("float16", _hqq(4, 1), _hqq4_axis1),
    "hqq-3bit-axis0": ("float16", _hqq(3, 0), _hqq3_axis0),
}


@pytest.mark.parametrize("case", sorted(LAYOUTS))
def test_published_layout_holds_the_checkpoint_bytes(tmp_path: Path, case: str) -> None:
    dtype_name, qc, layout = LAYOUTS[case]
    dtype = getattr(torch, dtype_name)
    config = _config(dtype_name, qc)
    model = _meta_model(config, dtype)
    tied = set(model.all_tied_weights_keys)
    tensors: Spec = {}
    for path, module in model.named_modules():
        for name, t in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            key = f"{path}.{name}" if path else name
            if key in tied or key not in model.state_dict():
                continue
            if isinstance(module, torch.nn.Linear) and path != "lm_head" and name == "weight":
                for attr, spec in layout(module.in_features, module.out_features, 32, dtype_name).items():
                    tensors[f"{path}.{attr}"] = spec
            else:
                tensors[key] = (tuple(t.shape), str(t.dtype).removeprefix("torch."))
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_header_only(tmp_path / "model.safetensors", tensors)
    q = _assert_holds_the_checkpoint(tmp_path, config, dtype)
    assert q["converted_linears"] == 24


# -- what is refused, and module selection ----------------------------------------------------------


@pytest.mark.parametrize(
    ("qc", "match"),
    [
        (_ao("Int4WeightOnlyConfig", {"group_size": 32, "int4_packing_format": "preshuffled"}), "int4_packing_format"),
        (_ao("FqnToConfig", {}), "not emulated"),
        ({**_ao("Int8WeightOnlyConfig", {}), "include_input_output_embeddings": True}, "embeddings"),
        (
            {
                "quant_method": "hqq",
                "skip_modules": [],
                "quant_config": {
                    "self_attn.q_proj": _hqq(4, 1)["quant_config"],
                    "mlp.up_proj": _hqq(2, 1)["quant_config"],
                },
            },
            "per tag",
        ),
    ],
)
def test_what_is_not_emulated_is_refused_with_the_reason(tmp_path: Path, qc: dict[str, Any], match: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_config("bfloat16", qc)))
    with pytest.raises(InputError, match=match):
        estimate(str(tmp_path / "config.json"), prompt_tokens=8, new_tokens=2)


def test_hqq_dynamic_config_quantizes_only_its_tags(tmp_path: Path) -> None:
    one = _hqq(4, 1)["quant_config"]
    qc = {
        "quant_method": "hqq",
        "skip_modules": ["lm_head"],
        "quant_config": {"self_attn.q_proj": one, "mlp.down_proj": one, "self_attn.k_proj": None},
    }
    (tmp_path / "config.json").write_text(json.dumps(_config("float16", qc)))
    card = estimate(str(tmp_path / "config.json"), prompt_tokens=8, new_tokens=2)
    q = card.quantization
    assert q is not None and q["converted_linears"] == 4  # 2 text layers x (q_proj, down_proj)
    assert "model.language_model.layers.0.self_attn.k_proj" in q["unquantized"]["not in the dynamic_config tags"]
    assert any("HQQ" in line for line in card.quantization_lines())


def test_torchao_modules_to_not_convert_keeps_the_vision_tower(tmp_path: Path) -> None:
    qc = {
        **_ao("Int8WeightOnlyConfig", {"granularity": {"_type": "PerRow", "_data": {"dim": -1}}}),
        "modules_to_not_convert": ["model.visual", "lm_head"],
    }
    (tmp_path / "config.json").write_text(json.dumps(_config("bfloat16", qc)))
    q = estimate(str(tmp_path / "config.json"), prompt_tokens=8, new_tokens=2).quantization
    assert q is not None and q["converted_linears"] == 14  # the text decoder only
    assert all(p.startswith("model.visual") or p == "lm_head" for p in q["unquantized"]["modules_to_not_convert"])
    assert [t["what"] for t in q["transients"]][0].startswith("weight-only")


@pytest.mark.parametrize(
    ("qc", "kernel"),
    [
        (_ao("Int4WeightOnlyConfig", {"group_size": 32, "int4_packing_format": _PLAIN}), {"dequant_above": None}),
        (
            _ao("Int8DynamicActivationInt8WeightConfig", {}),
            {"dequant_above": None, "act_bytes": 1, "int32_product": True},
        ),
        (_ao("Int8WeightOnlyConfig", {}), {"dequant_above": 0}),
        (_hqq(4, 1), {"dequant_above": 0}),
    ],
)
def test_the_meta_run_holds_what_each_torchao_kernel_makes(qc: dict[str, Any], kernel: dict[str, Any]) -> None:
    """int4 multiplies the packed codes (no dequantized weight), the dynamic-activation configs
    quantize the input and keep an int32 product; weight-only and HQQ dequantize every call."""
    from memwarden.estimation.quantized import parse_scheme
    from memwarden.estimation.stored import _kernel

    scheme = parse_scheme(qc)
    assert scheme is not None
    assert _kernel(scheme) == kernel
