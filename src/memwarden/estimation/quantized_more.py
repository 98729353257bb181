"""HQQ and torchao checkpoints in their own layout: the ``quantization_config`` parsed into a
:class:`MoreSpec` and the tensors each method stores for one ``nn.Linear``. Pure: no torch, no
hqq, no torchao (dtypes are names). :mod:`memwarden.estimation.quantized` dispatches here and owns
module selection.

Layouts, from the libraries' sources (hqq 0.2.8, torchao 0.18; checked against tensors the
libraries wrote on CPU where they run there, see ``tests/test_estimate_hqq_torchao.py``):

- HQQ, ``hqq/core/quantize.py`` ``Quantizer.quantize`` and ``HQQLinear.state_dict`` (encoded for
  safetensors by ``hqq/core/utils.py`` ``encode_safetensor_type``): the (out, in) weight is
  reshaped to (out*in/g, g) on axis 1 or (g, out*in/g) on axis 0 (g = in, resp. out, when
  ``group_size`` is None), quantized per column of that view, and its first dimension packed by
  ``core/bitpack.py``: 8 bits as is, 4/2/1 bits 2/4/8 codes per uint8, 3 bits 10 codes per int32
  (rows padded to 10). ``scale`` and ``zero`` (out*in/g, 1) resp. (1, out*in/g) in the compute
  dtype, ``bias`` in the compute dtype, and 17 small metadata tensors (ints as int32 scalars,
  bools as uint8 scalars, ``shape`` int64 (2,), strings as uint8 code points). ``view_as_float``
  stores ``W_q`` viewed as the compute dtype (same bytes).
- torchao, safetensors via ``torchao/prototype/safetensors/safetensors_support.py``
  ``flatten_tensor_state_dict``: each tensor attribute of the weight subclass becomes
  ``<module>._weight_<attr>``; the bias stays ``<module>.bias`` in the model dtype.
  ``Int8Tensor`` (``quantize_/workflows/int8/int8_tensor.py``): ``qdata`` int8 (out, in),
  ``scale`` fp32 and ``zero_point`` int8, (out, groups) with groups 1 per row, in/g per group,
  (1, 1) per tensor. ``Float8Tensor`` (``workflows/float8/float8_tensor.py``): ``qdata`` fp8
  (out, in), ``scale`` fp32 (out, 1) per row or (1, 1) per tensor. ``Int4Tensor`` (plain,
  ``workflows/int4/int4_tensor.py`` ``from_hp``): ``qdata`` int8 (out, in/2), ``scale`` and
  ``zero_point`` (in/g, out) in the model dtype. ``Int4TilePackedTo4dTensor``
  (``workflows/int4/int4_tile_packed_to_4d_tensor.py``): in padded to a multiple of 1024, out to
  ``int4_tile_packed_ntile``; ``qdata`` int32 (out/8, in/128, 32, 4) (inner_k_tiles = 8),
  ``scale_and_zero`` (in/g, out, 2) in bf16. ``IntxUnpackedToInt8Tensor``
  (``workflows/intx/intx_unpacked_to_int8_tensor.py``): ``qdata`` int8 (out, in), ``scale``
  (out, groups) in ``scale_dtype`` (the model dtype when None), ``zero_point`` int8 (out, groups).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from memwarden.errors import InputError
from memwarden.units import DTYPE_BYTES

__all__ = ["MoreSpec", "more_tensors", "parse_hqq", "parse_torchao"]

_Spec = tuple[tuple[int, ...], str]  # (shape, torch dtype name)

# hqq core/quantize.py Quantizer.bit_to_packing and unpack_view_dtype
_HQQ_PACKING = {8: "8bit_u8", 4: "4bit_u8", 3: "3bit_32", 2: "2bit_u8", 1: "1bit_u8"}
_HQQ_ROWS_PER_CODE = {8: 1, 4: 2, 2: 4, 1: 8}  # uint8 packings: rows folded into one byte


@dataclass(frozen=True, kw_only=True)
class MoreSpec:
    """What an HQQ or torchao ``quantization_config`` says beyond :class:`~memwarden.estimation.quantized.Scheme`."""

    method: str  # hqq | torchao
    layout: str  # hqq: axis0|axis1; torchao: int8|float8|int4-plain|int4-tile|intx
    label: str  # for the card
    bits: int
    group_size: int  # -1: one group per row (torchao) or per whole axis (hqq)
    axis: int = 1  # hqq grouping axis
    view_as_float: bool = False  # hqq stores W_q viewed as the compute dtype
    tags: tuple[str, ...] | None = None  # hqq dynamic_config: linear tags with a config (None: every Linear)
    per_tensor: bool = False  # torchao one scale per weight
    weight_dtype: str = ""  # torchao float8: float8_e4m3fn | float8_e5m2
    scale_dtype: str = ""  # torchao intx scale dtype; "" = the model's
    act_quant: bool = False  # torchao quantizes activations dynamically (int8 or float8)
    ntile: int = 8  # torchao tile-packed int4: out padded to this


def _bits(value: Any) -> int:
    if value == 1.58:  # ternary: stored with the 2-bit packing (hqq Quantizer.bit_to_packing)
        return 2
    if isinstance(value, bool) or value not in _HQQ_PACKING:
        raise InputError(f"HQQ nbits {str(value)[:20]!r} is not one hqq packs (8, 4, 3, 2, 1.58, 1)")
    return int(value)


def _hqq_one(wqp: Any) -> tuple[int, int, int, bool]:
    """(nbits, group size or -1, axis, view_as_float) of one ``weight_quant_params``."""
    if not isinstance(wqp, dict):
        raise InputError("HQQ quant_config has no weight_quant_params object")
    group = wqp.get("group_size")
    if group is not None and (isinstance(group, bool) or not isinstance(group, int) or not 1 <= group <= 1 << 16):
        raise InputError(f"HQQ group_size {str(group)[:20]!r} is not a positive integer or null")
    axis = wqp.get("axis", 0)
    if axis not in (0, 1):
        raise InputError(f"HQQ axis {str(axis)[:20]!r} is not 0 or 1")
    if wqp.get("channel_wise") is False:
        raise InputError("HQQ channel_wise=false (one scale for the whole weight) is not emulated")
    return _bits(wqp.get("nbits", 4)), -1 if group is None else group, int(axis), bool(wqp.get("view_as_float"))


def parse_hqq(q: dict[str, Any]) -> MoreSpec:
    """An HQQ ``quantization_config`` as transformers' ``HqqConfig.to_dict`` writes it:
    ``quant_config`` is one hqq ``BaseQuantizeConfig`` for every Linear, or (``dynamic_config``)
    one per linear tag, where a tag left out or null stays unquantized."""
    qc = q.get("quant_config")
    if not isinstance(qc, dict):
        raise InputError("HQQ quantization_config has no quant_config object")
    if "weight_quant_params" in qc:
        one, tags = _hqq_one(qc["weight_quant_params"]), None
    else:
        if len(qc) > 4096:
            raise InputError("HQQ quant_config lists more than 4096 tags")
        chosen = {
            str(tag)[:200]: _hqq_one(c.get("weight_quant_params")) for tag, c in qc.items() if isinstance(c, dict)
        }
        if len(set(chosen.values())) > 1:
            raise InputError("HQQ dynamic_config with different settings per tag is not emulated (one setting is)")
        if not chosen:
            raise InputError("HQQ dynamic_config quantizes no tag")
        one, tags = next(iter(chosen.values())), tuple(chosen)
    bits, group, axis, as_float = one
    label = f"HQQ {bits}-bit, group {group if group > 0 else 'whole axis'}, axis {axis}"
    return MoreSpec(
        method="hqq",
        layout=f"axis{axis}",
        label=label,
        bits=bits,
        group_size=group,
        axis=axis,
        view_as_float=as_float,
        tags=tags,
    )


def _hqq_tensors(spec: MoreSpec, in_f: int, out_f: int, bias: bool, dtype: str) -> dict[str, _Spec]:
    group = spec.group_size if spec.group_size > 0 else (in_f if spec.axis == 1 else out_f)
    other = in_f * out_f // group
    rows, cols = (other, group) if spec.axis == 1 else (group, other)  # the view quantized per column
    if spec.bits == 3:
        w_q: _Spec = ((math.ceil(rows / 10), cols), "int32")
    else:
        w_q = ((rows // _HQQ_ROWS_PER_CODE[spec.bits], cols), "uint8")
    if spec.view_as_float:  # W_q.view(compute_dtype): same bytes, last dimension rescaled
        (r, c), stored = w_q
        w_q = ((r, c * DTYPE_BYTES[stored] // DTYPE_BYTES.get(dtype, 2)), dtype)
    qparam = (other, 1) if spec.axis == 1 else (1, other)
    packing = _HQQ_PACKING[spec.bits]
    meta: dict[str, _Spec] = {
        "nbits": ((), "int32"),
        "group_size": ((), "int32"),
        "axis": ((), "int32"),
        "shape": ((2,), "int64"),
        "packing": ((len(packing),), "uint8"),
        "unpack_view_dtype": ((len("torch.int32" if spec.bits == 3 else "torch.uint8"),), "uint8"),
        "compute_dtype": ((len(f"torch.{dtype}"),), "uint8"),
    }
    for flag in (
        "view_as_float",
        "quant_scale",
        "quant_zero",
        "offload_meta",
        "encoded_state_dict",
        "stores_quant_config",
        "channel_wise",
        "optimize",
        "round_zero",
    ):
        meta[flag] = ((), "uint8")
    out = {"W_q": w_q, "scale": (qparam, dtype), "zero": (qparam, dtype), **meta}
    return {**out, **({"bias": ((out_f,), dtype)} if bias else {})}


# -- torchao -----------------------------------------------------------------------------------------

_AO_INT8 = ("Int8WeightOnlyConfig", "Int8DynamicActivationInt8WeightConfig")
_AO_FP8 = ("Float8WeightOnlyConfig", "Float8DynamicActivationFloat8WeightConfig")
_AO_INTX = ("IntxWeightOnlyConfig", "Int8DynamicActivationIntxWeightConfig")
_AO_TYPES = (*_AO_INT8, *_AO_FP8, "Int4WeightOnlyConfig", *_AO_INTX)


def _value(v: Any) -> Any:
    """torchao ``config_to_dict`` wraps enums and dtypes as {"_type", "_data"}."""
    return v.get("_data") if isinstance(v, dict) and "_type" in v else v


def _granularity(g: Any, weight_last: bool = True) -> tuple[int, bool]:
    """(group size or -1 per row, per tensor) of a serialized torchao granularity."""
    if isinstance(g, list) and g:
        g = g[-1] if weight_last else g[0]  # Float8 dynamic: [activation, weight]
    if g is None:
        return -1, False
    if not isinstance(g, dict):
        raise InputError("torchao granularity is not an object")
    kind, data = g.get("_type"), g.get("_data") or {}
    if kind in ("PerRow", "PerAxis", "PerToken"):
        return -1, False
    if kind == "PerTensor":
        return -1, True
    if kind == "PerGroup" and isinstance(data, dict):
        size = data.get("group_size")
        if isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= 1 << 16:
            return size, False
    raise InputError(f"torchao granularity {str(kind)[:40]!r} is not emulated (PerRow, PerAxis, PerTensor, PerGroup)")


def parse_torchao(q: dict[str, Any]) -> MoreSpec:
    """A torchao ``quantization_config`` as transformers' ``TorchAoConfig.to_dict`` writes it:
    ``quant_type`` = {"default": torchao ``config_to_dict`` of an ``AOBaseConfig``}."""
    qt = q.get("quant_type")
    if not isinstance(qt, dict) or not isinstance(qt.get("default"), dict):
        raise InputError("torchao quantization_config.quant_type has no 'default' config (transformers >= 4.5x form)")
    if q.get("include_input_output_embeddings"):
        raise InputError("torchao include_input_output_embeddings (quantized embeddings) is not emulated")
    d = qt["default"]
    kind, data, version = str(d.get("_type", ""))[:60], d.get("_data"), d.get("_version", 1)
    if kind not in _AO_TYPES:
        raise InputError(f"torchao {kind!r} is not emulated (supported: {', '.join(_AO_TYPES)})")
    if not isinstance(data, dict):
        raise InputError(f"torchao {kind} has no _data object")
    if version != 2:  # version 1 is AffineQuantizedTensor, which torchao's safetensors support refuses
        raise InputError(f"torchao {kind} version {str(version)[:10]} is not emulated (version 2 tensors are)")
    act = "Dynamic" in kind
    if kind in _AO_INT8:
        group, per_tensor = _granularity(data.get("granularity"))
        return MoreSpec(
            method="torchao",
            layout="int8",
            bits=8,
            group_size=group,
            per_tensor=per_tensor,
            act_quant=act,
            label=f"torchao {kind} (int8, {_gran_text(group, per_tensor)})",
        )
    if kind in _AO_FP8:
        group, per_tensor = _granularity(data.get("granularity"))
        if group != -1:
            raise InputError("torchao float8 with group granularity is not emulated (per row, per tensor are)")
        wdt = str(_value(data.get("weight_dtype")) or "float8_e4m3fn").removeprefix("torch.")
        if wdt not in ("float8_e4m3fn", "float8_e5m2"):
            raise InputError(f"torchao float8 weight_dtype {wdt[:20]!r} is not emulated")
        return MoreSpec(
            method="torchao",
            layout="float8",
            bits=8,
            group_size=-1,
            per_tensor=per_tensor,
            weight_dtype=wdt,
            act_quant=act,
            label=f"torchao {kind} ({wdt}, {_gran_text(-1, per_tensor)})",
        )
    if kind == "Int4WeightOnlyConfig":
        fmt = str(_value(data.get("int4_packing_format")) or "plain").lower()
        if fmt not in ("plain", "tile_packed_to_4d"):
            raise InputError(f"torchao int4_packing_format {fmt[:30]!r} is not emulated (plain, tile_packed_to_4d)")
        group = data.get("group_size", 128)
        ntile = data.get("int4_tile_packed_ntile", 8)
        if not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1 << 16 for v in (group, ntile)):
            raise InputError(
                "torchao Int4WeightOnlyConfig group_size / int4_tile_packed_ntile must be positive integers"
            )
        layout = "int4-plain" if fmt == "plain" else "int4-tile"
        return MoreSpec(
            method="torchao",
            layout=layout,
            bits=4,
            group_size=group,
            ntile=ntile,
            label=f"torchao {kind} (int4 {fmt}, group {group})",
        )
    fmt = str(_value(data.get("intx_packing_format")) or "unpacked_to_int8").lower()
    if fmt != "unpacked_to_int8":
        raise InputError(f"torchao intx_packing_format {fmt[:30]!r} is not emulated (unpacked_to_int8)")
    gran = data.get("weight_granularity" if act else "granularity", {"_type": "PerGroup", "_data": {"group_size": 32}})
    group, per_tensor = _granularity(gran)
    wdt = str(_value(data.get("weight_dtype")) or "int8").removeprefix("torch.")
    sdt = _value(data.get("weight_scale_dtype" if act else "scale_dtype"))
    bits = int(wdt.removeprefix("int")) if wdt.removeprefix("int").isdigit() else 8
    return MoreSpec(
        method="torchao",
        layout="intx",
        bits=bits,
        group_size=group,
        per_tensor=per_tensor,
        act_quant=act,
        scale_dtype=str(sdt).removeprefix("torch.") if sdt else "",
        label=f"torchao {kind} ({wdt} in int8, {_gran_text(group, per_tensor)})",
    )


def _gran_text(group: int, per_tensor: bool) -> str:
    return "per tensor" if per_tensor else f"group {group}" if group > 0 else "per row"


def _ao_tensors(spec: MoreSpec, in_f: int, out_f: int, bias: bool, dtype: str) -> dict[str, _Spec]:
    groups = math.ceil(in_f / spec.group_size) if spec.group_size > 0 else 1
    qparam = (1, 1) if spec.per_tensor else (out_f, groups)
    out: dict[str, _Spec]
    if spec.layout == "int8":
        out = {
            "_weight_qdata": ((out_f, in_f), "int8"),
            "_weight_scale": (qparam, "float32"),
            "_weight_zero_point": (qparam, "int8"),
        }
    elif spec.layout == "float8":
        out = {"_weight_qdata": ((out_f, in_f), spec.weight_dtype), "_weight_scale": (qparam, "float32")}
    elif spec.layout == "int4-plain":
        out = {
            "_weight_qdata": ((out_f, math.ceil(in_f / 2)), "int8"),
            "_weight_scale": ((groups, out_f), dtype),
            "_weight_zero_point": ((groups, out_f), dtype),
        }
    elif spec.layout == "int4-tile":
        k = math.ceil(in_f / 1024) * 1024  # padded for the tinygemm kernel
        n = math.ceil(out_f / spec.ntile) * spec.ntile
        out = {
            "_weight_qdata": ((n // 8, k // 128, 32, 4), "int32"),
            "_weight_scale_and_zero": ((k // spec.group_size, n, 2), "bfloat16"),
        }
    else:  # intx unpacked to int8
        out = {
            "_weight_qdata": ((out_f, in_f), "int8"),
            "_weight_scale": (qparam, spec.scale_dtype or dtype),
            "_weight_zero_point": (qparam, "int8"),
        }
    return {**out, **({"bias": ((out_f,), dtype)} if bias else {})}


def more_tensors(spec: MoreSpec, in_f: int, out_f: int, bias: bool, dtype: str) -> dict[str, _Spec]:
    """name -> (shape, dtype) of one Linear as the method saves it; ``dtype``: the model's."""
    if spec.method == "hqq":
        return _hqq_tensors(spec, in_f, out_f, bias, dtype)
    return _ao_tensors(spec, in_f, out_f, bias, dtype)
