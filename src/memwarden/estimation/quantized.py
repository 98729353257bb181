"""A checkpoint's own quantized layout, read from the ``quantization_config`` of its config.json.

:func:`parse_scheme` turns the (untrusted) ``quantization_config`` into a :class:`Scheme`;
:func:`linear_tensors` gives the tensors the method's loader creates for one ``nn.Linear`` (the
exact names, shapes and dtypes it stores); :func:`converted` decides, as the loader does, which
Linear modules it replaces. Pure: no torch (dtypes are names); :mod:`memwarden.estimation.stored`
puts the tensors on the meta model.

Layouts, from the methods' own sources:

- AWQ, ``WQLinear_GEMM`` (AutoAWQ ``awq/modules/linear/gemm.py``; GPTQModel's AWQ modules, which
  transformers 5 loads through ``integrations/awq.py``): ``qweight`` int32 (in, out/pack),
  ``qzeros`` int32 (in/group, out/pack), ``scales`` fp16 (in/group, out), ``bias`` fp16, pack =
  32/bits. ``WQLinear_GEMV`` (``gemv.py``): ``qweight`` int32 (out, in/pack), ``qzeros`` int32
  (out, width), ``scales`` fp16 (out, width*pack), width = ``calculate_zeros_width``.
- GPTQ (auto-gptq ``nn_modules/qlinear/qlinear_cuda_old.py``, GPTQModel ``nn_modules/qlinear``):
  ``qweight`` int32 (in*bits/32, out), ``qzeros`` int32 (groups, out*bits/32), ``scales`` fp16
  (groups, out), ``g_idx`` int32 (in,) — saved whether or not ``desc_act`` — and ``bias`` fp16;
  groups = ceil(in/group_size), one group when group_size is -1.
- bitsandbytes 4-bit (``bitsandbytes/functional.py`` ``QuantState.as_dict(packed=True)``,
  ``nn/modules.py`` ``Params4bit``): ``weight`` uint8 (ceil(n/2), 1), ``weight.absmax`` (fp32 per
  blocksize weights, or uint8 with double quant plus ``weight.nested_absmax`` fp32 per 256 and
  ``weight.nested_quant_map`` fp32 (256,)), ``weight.quant_map`` fp32 (16,); the packed JSON
  ``weight.quant_state.bitsandbytes__nf4`` is parsed at load and not kept. 8-bit
  (``Int8Params``): ``weight`` int8 (out, in), ``SCB`` fp32 (out,); the saved ``weight_format``
  (uint8 scalar) is not kept (transformers ``integrations/bitsandbytes.py`` ``Bnb8bitDeserialize``
  reads ``weight`` and ``SCB`` only). A local folder's estimate keeps both metadata tensors (its headers'
  sum, exactly); from a config alone they are not modelled.
- compressed-tensors (``compressed_tensors/compressors/quantized_compressors/``):
  float-quantized FP8 ``weight`` fp8 (out, in) and ``weight_scale`` (out, 1) per channel, (1,)
  per tensor; int-quantized W8A8 ``weight`` int8; pack-quantized W4A16 ``weight_packed`` int32
  (out, ceil(in/pack)), ``weight_scale`` (out, groups), ``weight_shape`` int64 (2,),
  ``weight_zero_point`` int32 (ceil(out/pack), groups) when asymmetric; ``input_scale`` (1,)
  when the activations are quantized statically. Scales are stored in the model's dtype.
- FP8 (transformers ``integrations/finegrained_fp8.py`` ``FP8Linear``): ``weight`` fp8 (out, in),
  ``weight_scale_inv`` fp32 (ceil(out/b0), ceil(in/b1)) or a scalar without blocks,
  ``activation_scale`` fp32 scalar when static.
- HQQ and torchao: :mod:`memwarden.estimation.quantized_more`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from memwarden.errors import InputError
from memwarden.estimation.quantized_more import MoreSpec, more_tensors, parse_hqq, parse_torchao

__all__ = ["METHODS", "Scheme", "TensorSpec", "converted", "linear_tensors", "parse_scheme"]

METHODS = ("awq", "gptq", "bitsandbytes-4bit", "bitsandbytes-8bit", "compressed-tensors", "fp8", "hqq", "torchao")

TensorSpec = tuple[tuple[int, ...], str]  # (shape, torch dtype name)


@dataclass(frozen=True, kw_only=True)
class Scheme:
    """What a ``quantization_config`` says: the method, its storage and which modules it skips."""

    method: str  # one of METHODS
    bits: int
    group_size: int  # -1: one group per row
    variant: str  # awq: gemm|gemv; gptq: gptq; bnb: nf4|fp4; compressed-tensors: its format; fp8: block|tensor
    zero_point: bool = True  # stores zero points (AWQ, asymmetric GPTQ / W4A16)
    desc_act: bool = False
    double_quant: bool = False  # bitsandbytes 4-bit compress_statistics
    blocksize: int = 64  # bitsandbytes 4-bit absmax block
    strategy: str = "channel"  # compressed-tensors weight strategy: channel|tensor|group|block
    block: tuple[int, int] | None = None  # FP8 / compressed-tensors block
    static_input: bool = False  # activations quantized with a stored scale
    skip: tuple[str, ...] | None = None  # modules_to_not_convert / llm_int8_skip_modules / ignore
    targets: tuple[str, ...] = ("Linear",)  # compressed-tensors targets
    only_blocks: tuple[str, ...] | None = None  # GPTQ: block_name_to_quantize (None: the decoder stack)
    more: MoreSpec | None = None  # HQQ / torchao: their own settings
    # Saved by transformers >= 5 (config.json's transformers_version): its skip lists name
    # transformers 5's module paths (``model.visual``), which its loader alone matches; an older
    # checkpoint's lists use the old names (``visual``), matched against both.
    new_names_only: bool = False

    def describe(self) -> str:
        if self.more is not None:
            return self.more.label
        parts = {
            "awq": f"AWQ {self.bits}-bit {self.variant}, group {self.group_size}",
            "gptq": f"GPTQ {self.bits}-bit, group {self.group_size}{', desc_act' if self.desc_act else ''}"
            f"{'' if self.zero_point else ', sym'}",
            "bitsandbytes-4bit": f"bitsandbytes {self.variant.upper()}{' + double quant' if self.double_quant else ''}",
            "bitsandbytes-8bit": "bitsandbytes LLM.int8",
            "compressed-tensors": f"compressed-tensors {self.variant} ({self.bits}-bit weights, {self.strategy})",
            "fp8": f"FP8 {'block ' + 'x'.join(map(str, self.block)) if self.block else 'per tensor'}",
        }
        return parts[self.method]


def _int(q: dict[str, Any], key: str, default: int, allowed: tuple[int, ...] | None = None) -> int:
    value = q.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or (allowed is not None and value not in allowed):
        raise InputError(
            f"quantization_config.{key} = {str(value)[:40]!r} is not one this tool accepts"
            + (f" ({', '.join(map(str, allowed))})" if allowed else "")
        )
    if allowed is None and not (value == -1 or 1 <= value <= 1 << 16):
        raise InputError(f"quantization_config.{key} = {value} is not a group size (-1 or 1..65536)")
    return value


def _names(value: Any, key: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or len(value) > 4096 or not all(isinstance(v, str) and len(v) < 512 for v in value):
        raise InputError(f"quantization_config.{key} must be a list of module names")
    out: list[str] = []
    for v in value:  # duplicated keys in published configs: kept once
        if v not in out:
            out.append(v)
    return tuple(out)


def parse_scheme(q: Any) -> Scheme | None:
    """The scheme of a config.json's ``quantization_config``; None when it has none; InputError
    for a method this estimator does not emulate (rather than estimating it as unquantized)."""
    if q is None:
        return None
    if not isinstance(q, dict):
        raise InputError("quantization_config is not an object")
    method = str(q.get("quant_method", "")).lower().replace("_", "-")
    if method == "bitsandbytes" or (not method and (q.get("load_in_4bit") or q.get("load_in_8bit"))):
        method = "bitsandbytes-4bit" if q.get("load_in_4bit") or q.get("_load_in_4bit") else "bitsandbytes-8bit"
    if method == "awq":
        variant = str(q.get("version") or q.get("format") or "gemm").lower()
        if variant not in ("gemm", "gemv"):
            raise InputError(f"AWQ version {variant[:20]!r} is not emulated (gemm, gemv)")
        skip = _names(q.get("modules_to_not_convert"), "modules_to_not_convert")
        return Scheme(
            method="awq",
            bits=_int(q, "bits", 4, (4,)),
            group_size=_int(q, "group_size", 128),
            variant=variant,
            zero_point=bool(q.get("zero_point", True)),
            skip=skip,
        )
    if method in ("gptq", "auto-round", "intel/auto-round"):
        packing = str(q.get("packing_format", "gptq"))
        if method != "gptq" and "gptq" not in packing and "auto_round" not in packing:
            raise InputError(f"AutoRound packing_format {packing[:40]!r} is not emulated (its GPTQ-style export is)")
        blocks = _names(q.get("block_name_to_quantize"), "block_name_to_quantize")
        return Scheme(
            method="gptq",
            bits=_int(q, "bits", 4, (2, 3, 4, 8)),
            group_size=_int(q, "group_size", 128),
            variant="gptq",
            zero_point=not bool(q.get("sym", True)),
            desc_act=bool(q.get("desc_act", False)),
            skip=_names(q.get("modules_to_not_convert"), "modules_to_not_convert"),
            only_blocks=blocks,
        )
    if method == "bitsandbytes-4bit":
        variant = str(q.get("bnb_4bit_quant_type", "fp4")).lower()
        if variant not in ("nf4", "fp4"):
            raise InputError(f"bnb_4bit_quant_type {variant[:20]!r} is not nf4 or fp4")
        return Scheme(
            method=method,
            bits=4,
            group_size=64,
            variant=variant,
            double_quant=bool(q.get("bnb_4bit_use_double_quant", False)),
            skip=_names(q.get("llm_int8_skip_modules"), "llm_int8_skip_modules"),
        )
    if method == "bitsandbytes-8bit":
        return Scheme(
            method=method,
            bits=8,
            group_size=-1,
            variant="int8",
            skip=_names(q.get("llm_int8_skip_modules"), "llm_int8_skip_modules"),
        )
    if method == "fp8":
        block = q.get("weight_block_size")
        if block is not None and (
            not isinstance(block, list)
            or len(block) != 2
            or not all(isinstance(b, int) and 1 <= b <= 1 << 16 for b in block)
        ):
            raise InputError("quantization_config.weight_block_size must be two positive integers")
        return Scheme(
            method="fp8",
            bits=8,
            group_size=-1,
            variant="block" if block else "tensor",
            block=(block[0], block[1]) if block else None,
            static_input=q.get("activation_scheme") == "static",
            skip=_names(q.get("modules_to_not_convert"), "modules_to_not_convert"),
        )
    if method == "compressed-tensors":
        return _compressed_tensors(q)
    if method in ("hqq", "torchao"):
        more = parse_hqq(q) if method == "hqq" else parse_torchao(q)
        # HqqConfig: skip_modules defaults to ["lm_head"]; TorchAoConfig: modules_to_not_convert to None
        key, default = ("skip_modules", ["lm_head"]) if method == "hqq" else ("modules_to_not_convert", None)
        return Scheme(
            method=method,
            bits=more.bits,
            group_size=more.group_size,
            variant=more.layout,
            skip=_names(q.get(key, default), key),
            more=more,
        )
    raise InputError(
        f"quantization_config.quant_method {method[:40]!r} is not emulated yet (supported: {', '.join(METHODS)}); "
        "estimating it as unquantized would overstate the weights"
    )


def _compressed_tensors(q: dict[str, Any]) -> Scheme:
    fmt = str(q.get("format", "dense"))
    groups = q.get("config_groups") or {}
    if not isinstance(groups, dict) or not groups:
        raise InputError("compressed-tensors quantization_config has no config_groups")
    group = next(iter(groups.values()))
    if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
        raise InputError("compressed-tensors config group has no weights scheme")
    w = group["weights"]
    inputs = group.get("input_activations") if isinstance(group.get("input_activations"), dict) else None
    strategy = str(w.get("strategy", "channel"))
    kind = str(w.get("type", "int"))
    bits = _int(w, "num_bits", 8, (2, 4, 8))
    block = w.get("block_structure")
    targets = _names(group.get("targets"), "targets") or ("Linear",)
    return Scheme(
        method="compressed-tensors",
        bits=bits,
        group_size=_int(w, "group_size", -1) if strategy == "group" else -1,
        variant=fmt if fmt != "dense" else f"{kind}-quantized",
        zero_point=not bool(w.get("symmetric", True)),
        strategy=strategy,
        block=(int(block[0]), int(block[1])) if isinstance(block, list) and len(block) == 2 else None,
        static_input=inputs is not None and not inputs.get("dynamic", False),
        skip=_names(q.get("ignore"), "ignore") or (),
        targets=targets,
    )


# -- the tensors of one Linear --------------------------------------------------------------------


def linear_tensors(scheme: Scheme, in_f: int, out_f: int, bias: bool, dtype: str) -> dict[str, TensorSpec]:
    """name -> (shape, dtype) of what the loader keeps for one quantized Linear; ``dtype``: the
    model's (compute) dtype, which unquantized biases and compressed-tensors scales keep."""
    m = scheme.method
    if scheme.more is not None:
        return more_tensors(scheme.more, in_f, out_f, bias, dtype)
    out: dict[str, TensorSpec] = {}
    groups = 1 if scheme.group_size == -1 else math.ceil(in_f / scheme.group_size)
    if m == "awq":
        pack = 32 // scheme.bits
        if scheme.variant == "gemm":
            out = {
                "qweight": ((in_f, out_f // pack), "int32"),
                "qzeros": ((groups, out_f // pack), "int32"),
                "scales": ((groups, out_f), "float16"),
            }
        else:  # AutoAWQ utils/module.py calculate_zeros_width
            mult = 1 if scheme.group_size >= 128 else 2 if scheme.group_size == 64 else 4
            width = math.ceil(math.ceil(in_f / scheme.group_size / pack) / mult) * mult
            out = {
                "qweight": ((out_f, in_f // pack), "int32"),
                "qzeros": ((out_f, width), "int32"),
                "scales": ((out_f, width * pack), "float16"),
            }
        return {**out, **({"bias": ((out_f,), "float16")} if bias else {})}
    if m == "gptq":
        b = scheme.bits
        out = {
            "qweight": ((in_f // 32 * b, out_f), "int32"),
            "qzeros": ((groups, out_f // 32 * b), "int32"),
            "scales": ((groups, out_f), "float16"),
            "g_idx": ((in_f,), "int32"),
        }
        return {**out, **({"bias": ((out_f,), "float16")} if bias else {})}
    if m == "bitsandbytes-4bit":
        n = in_f * out_f
        blocks = math.ceil(n / scheme.blocksize)
        out = {"weight": ((math.ceil(n / 2), 1), "uint8"), "weight.quant_map": ((16,), "float32")}
        if scheme.double_quant:
            out |= {
                "weight.absmax": ((blocks,), "uint8"),
                "weight.nested_absmax": ((math.ceil(blocks / 256),), "float32"),
                "weight.nested_quant_map": ((256,), "float32"),
            }
        else:
            out["weight.absmax"] = ((blocks,), "float32")
        return {**out, **({"bias": ((out_f,), dtype)} if bias else {})}
    if m == "bitsandbytes-8bit":
        return {
            "weight": ((out_f, in_f), "int8"),
            "SCB": ((out_f,), "float32"),
            **({"bias": ((out_f,), dtype)} if bias else {}),
        }
    if m == "fp8":
        if scheme.block:
            scale: TensorSpec = ((math.ceil(out_f / scheme.block[0]), math.ceil(in_f / scheme.block[1])), "float32")
        else:
            scale = ((), "float32")
        out = {"weight": ((out_f, in_f), "float8_e4m3fn"), "weight_scale_inv": scale}
        if scheme.static_input:
            out["activation_scale"] = ((), "float32")
        return {**out, **({"bias": ((out_f,), dtype)} if bias else {})}
    return _ct_tensors(scheme, in_f, out_f, bias, dtype, groups)


def _ct_tensors(scheme: Scheme, in_f: int, out_f: int, bias: bool, dtype: str, groups: int) -> dict[str, TensorSpec]:
    s = scheme.strategy
    if s == "tensor":
        scale_shape: tuple[int, ...] = (1,)
    elif s == "group":
        scale_shape = (out_f, groups)
    elif s == "block" and scheme.block:
        scale_shape = (math.ceil(out_f / scheme.block[0]), math.ceil(in_f / scheme.block[1]))
    else:
        scale_shape = (out_f, 1)
    out: dict[str, TensorSpec] = {}
    if scheme.variant == "pack-quantized":
        pack = 32 // scheme.bits
        out["weight_packed"] = ((out_f, math.ceil(in_f / pack)), "int32")
        out["weight_shape"] = ((2,), "int64")
        if scheme.zero_point:
            out["weight_zero_point"] = ((math.ceil(out_f / pack), scale_shape[-1]), "int32")
    elif scheme.variant == "float-quantized":
        out["weight"] = ((out_f, in_f), "float8_e4m3fn")
    else:  # int-quantized / naive-quantized
        out["weight"] = ((out_f, in_f), "int8")
        if scheme.zero_point:
            out["weight_zero_point"] = (scale_shape, "int8")
    out["weight_scale"] = (scale_shape, dtype)
    if scheme.static_input:
        out["input_scale"] = ((1,), dtype)
    return {**out, **({"bias": ((out_f,), dtype)} if bias else {})}


# -- which modules the loader converts -----------------------------------------------------------


def _skipped(name: str, patterns: tuple[str, ...]) -> bool:
    """transformers 5 ``quantizers_utils.should_convert_module``: a pattern matches from the start
    to a module boundary (as a regex) or as a suffix."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    for key in patterns:
        try:
            if re.match(rf"(?:{key}){boundary}", name) or name.endswith(key):
                return True
        except re.error:
            if name.endswith(key):
                return True
    return False


def _ct_match(names: tuple[str, ...], cls: str, patterns: tuple[str, ...]) -> bool:
    """compressed-tensors ``utils/match.py`` ``is_match``: an exact name, ``re:`` + a regex
    (``re.match``) or a class name."""
    for p in patterns:
        if p == cls:
            return True
        for n in names:
            if p.startswith("re:"):
                try:
                    if re.match(p[3:], n):
                        return True
                except re.error:
                    continue
            elif n == p:
                return True
    return False


def converted(
    scheme: Scheme, path: str, checkpoint_names: tuple[str, ...], defaults: tuple[str, ...], decoder_stack: str | None
) -> tuple[bool, str]:
    """(whether the loader replaces the Linear at ``path``, why not). ``checkpoint_names``: the
    names the checkpoint may use for it (pre-transformers-5 paths: ``visual.`` for ``model.visual.``);
    ``defaults``: transformers' ``get_keys_to_not_convert`` plus ``_keep_in_fp32_modules``;
    ``decoder_stack``: the text decoder's layer list, where GPTQ quantizes."""
    m = scheme.method
    # compressed-tensors writes its ignore list in its own (old) names whatever saved it
    names = (path,) if scheme.new_names_only and m != "compressed-tensors" else (path, *checkpoint_names)
    if m == "compressed-tensors":
        if _ct_match(names, "Linear", scheme.skip or ()):
            return False, "ignore list"
        if not _ct_match(names, "Linear", scheme.targets):
            return False, "not a target"
        return True, ""
    if m == "gptq":
        blocks = scheme.only_blocks or ((decoder_stack,) if decoder_stack else ())
        if not any(n == b or n.startswith(b + ".") for n in names for b in blocks):
            return False, "outside the quantized blocks"
        if scheme.skip and any(_skipped(n, scheme.skip) for n in names):
            return False, "modules_to_not_convert"
        return True, ""
    if m == "hqq":
        return _hqq_converted(scheme, names)
    if m == "torchao":  # TorchAoHfQuantizer.param_needs_quantization tests the weight's name, not the module's
        names = tuple(f"{n}.weight" for n in names)
    # awq adds the defaults to its list; bitsandbytes and fp8 use them only when the config lists none
    # (transformers quantizers/base.py get_modules_to_not_convert, add_default_skips).
    if scheme.skip and any(_skipped(n, scheme.skip) for n in names):
        return False, "llm_int8_skip_modules" if m.startswith("bitsandbytes") else "modules_to_not_convert"
    if (m == "awq" or scheme.skip is None) and any(_skipped(n, defaults) for n in names):
        return False, "output head / tied weights (kept by default)"
    return True, ""


def _hqq_converted(scheme: Scheme, names: tuple[str, ...]) -> tuple[bool, str]:
    """transformers 4.x ``HqqHfQuantizer.create_quantized_param``: a skip module anywhere in the
    name (substring) keeps the Linear; a dynamic config quantizes the tags it lists, a tag being
    the last two name parts (``self_attn.q_proj``) or, as ``integrations/hqq.py``
    ``name_to_linear_tag`` writes it, the name without ``model``, ``layers`` and layer numbers."""
    if any(skip in n for skip in scheme.skip or () for n in names):
        return False, "skip_modules"
    tags = scheme.more.tags if scheme.more else None
    if tags is not None:
        own = {
            t
            for n in names
            for t in (
                ".".join(n.split(".")[-2:]),
                ".".join(p for p in n.split(".") if p not in ("model", "layers") and not p.isnumeric()),
            )
        }
        if not own & set(tags):
            return False, "not in the dynamic_config tags"
    return True, ""
