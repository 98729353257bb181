"""The weights of the meta model as a checkpoint stores them: a quantized method's own tensors
(:mod:`memwarden.estimation.quantized`) or every tensor's dtype and shape from a local folder's
safetensors headers (:mod:`memwarden.estimation.checkpoint`), with the method's kernel emulated.

Checkpoint keys are mapped to module paths by transformers' own key renaming
(``conversion_mapping.get_model_conversion_mapping``: ``visual.`` -> ``model.visual.`` and the like);
a tensor whose module does not exist (a quant-state tensor) becomes a buffer of its nearest
module, so its bytes are held as the loader holds them. Tied parameters stay one tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from memwarden.estimation.quantized import Scheme, TensorSpec, converted, linear_tensors

__all__ = ["StoredLinear", "StoredLayout", "apply_checkpoint", "apply_scheme", "checkpoint_names", "renamer"]

META = torch.device("meta")


@dataclass
class StoredLayout:
    """What was stored how: for the card's ``quantization`` block."""

    method: str | None = None
    description: str = ""
    converted: int = 0
    kept: dict[str, list[str]] = field(default_factory=dict)  # why -> module paths left unquantized
    largest_in_out: tuple[int, int] = (0, 0)  # the largest converted Linear (in, out)
    checkpoint_bytes: int = 0  # bytes of the checkpoint's tensors as held (tied ones once)
    unmatched: list[str] = field(default_factory=list)  # checkpoint keys held on an ancestor module

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "description": self.description,
            "converted_linears": self.converted,
            "unquantized": {why: sorted(paths)[:64] for why, paths in self.kept.items()},
            "unquantized_count": sum(len(p) for p in self.kept.values()),
        }


class StoredLinear(torch.nn.Module):
    """A Linear held in a quantized method's layout on meta: its tensors as buffers (checkpoint
    names in ``tensor_names``) and the transients of the method's kernel, no values.

    ``dequant_above`` tokens: a call with more rows dequantizes the whole weight to the compute
    dtype first (bitsandbytes 4-bit: ``matmul_4bit`` runs ``gemv_4bit`` for one token and
    ``dequantize_4bit`` otherwise; AutoAWQ ``WQLinear_GEMM``: ``FP16_MATMUL_HEURISTIC_CONDITION``
    at 1024 rows; exllamav2's GPTQ kernel reconstructs above ``MAX_Q_GEMM_ROWS`` = 50;
    compressed-tensors ``CompressedLinear.forward`` decompresses on every call). ``act_bytes``:
    bytes per input element a kernel quantizes activations into (FP8: 1; LLM.int8: 1, and an
    int32 product)."""

    def __init__(
        self,
        in_f: int,
        out_f: int,
        tensors: dict[str, TensorSpec],
        dequant_above: int | None,
        act_bytes: int = 0,
        int32_product: bool = False,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_f, out_f
        self.tensor_names = tuple(tensors)
        self.dequant_above, self.act_bytes, self.int32_product = dequant_above, act_bytes, int32_product
        self.register_buffer("bias", None)
        for name, (shape, dtype) in tensors.items():
            self.register_buffer(name.replace(".", "_"), torch.empty(shape, dtype=getattr(torch, dtype), device=META))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(x.shape[-1], 1)  # (..., in) -> rows
        if self.dequant_above is not None and rows > self.dequant_above:
            weight = x.new_empty((self.out_features, self.in_features))  # (out, in) dequantized, freed after
            out = torch.nn.functional.linear(x, weight)
        else:
            if self.act_bytes:
                x.new_empty(x.shape, dtype=torch.int8)  # (..., in) activations quantized to 1 byte each
            if self.int32_product:
                x.new_empty((*x.shape[:-1], self.out_features), dtype=torch.int32)  # (..., out) int32 accumulator
            out = x.new_empty((*x.shape[:-1], self.out_features))  # fused kernel: the output only
        bias = self.bias
        return out.add_(bias.to(out.dtype)) if isinstance(bias, torch.Tensor) else out


def _kernel(scheme: Scheme | None) -> dict[str, Any]:
    if scheme is None:
        return {"dequant_above": 0}
    m = scheme.method
    if m == "bitsandbytes-4bit":
        return {"dequant_above": 1}
    if m == "bitsandbytes-8bit":
        return {"dequant_above": None, "act_bytes": 1, "int32_product": True}
    if m == "awq":
        return {"dequant_above": 1023 if scheme.variant == "gemm" else None}
    if m == "gptq":
        return {"dequant_above": 50}
    if m == "fp8" or scheme.variant == "float-quantized":
        return {"dequant_above": None, "act_bytes": 1}
    if scheme.variant == "int-quantized" and scheme.static_input:
        return {"dequant_above": None, "act_bytes": 1, "int32_product": True}
    more = scheme.more
    if m == "torchao" and more is not None:
        # torchao 0.18 quantize_/workflows: int4 runs fused kernels on the packed codes (mslk,
        # aten._weight_int4pack_mm); the dynamic-activation configs quantize the input and multiply
        # in int8 (int_scaled_matmul, an int32 product) or float8 (scaled mm); weight-only int8,
        # float8 and intx convert the weight to the compute dtype on every call.
        if more.layout.startswith("int4"):
            return {"dequant_above": None}
        if more.act_quant:
            return {"dequant_above": None, "act_bytes": 1, "int32_product": more.layout == "int8"}
    return {"dequant_above": 0}  # compressed-tensors packed, HQQ, torchao weight-only: dequantized on every call


def renamer(model: Any) -> Any:
    """checkpoint key -> model key, by transformers' own renaming rules for this model."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping

        rules = [r for r in get_model_conversion_mapping(model) if hasattr(r, "rename_source_key")]
    except Exception:  # an older transformers: checkpoint keys are module paths
        rules = []

    def rename(key: str) -> str:
        for rule in rules:
            key, _ = rule.rename_source_key(key)
        return key

    return rename


def checkpoint_names(path: str) -> tuple[str, ...]:
    """Names a pre-transformers-5 checkpoint (and its skip lists) may use for module ``path``."""
    out = []
    if path.startswith("model.language_model."):
        rest = path.removeprefix("model.language_model.")
        out += [f"model.{rest}", f"language_model.model.{rest}", rest]
    elif path.startswith("model."):
        rest = path.removeprefix("model.")
        out += [rest, f"model.{rest}"]
    if path == "lm_head":
        out.append("language_model.lm_head")
    return tuple(dict.fromkeys(n for n in out if n != path))


def _decoder_stack(model: Any) -> str | None:
    from memwarden.record.modality import ModalityRules
    from memwarden.trace.model import Modality

    rules = ModalityRules()
    stacks = [
        (path, len(m))
        for path, m in model.named_modules()
        if isinstance(m, torch.nn.ModuleList) and len(m) > 1 and rules.modality_of(path) == Modality.TEXT
    ]
    return max(stacks, key=lambda s: s[1])[0] if stacks else None


def _defaults(model: Any) -> tuple[str, ...]:
    from transformers.quantizers.base import get_keys_to_not_convert

    keys = list(get_keys_to_not_convert(model)) + list(getattr(model, "_keep_in_fp32_modules", None) or ())
    return tuple(dict.fromkeys(keys))


def apply_scheme(model: Any, scheme: Scheme, dtype: str) -> StoredLayout:
    """Replace every Linear the method's loader converts with its stored layout."""
    layout = StoredLayout(method=scheme.method, description=scheme.describe())
    defaults, stack = _defaults(model), _decoder_stack(model)
    kernel = _kernel(scheme)
    for path, module in list(model.named_modules()):
        if not isinstance(module, torch.nn.Linear):
            continue
        ok, why = converted(scheme, path, checkpoint_names(path), defaults, stack)
        if not ok:
            layout.kept.setdefault(why, []).append(path)
            continue
        tensors = linear_tensors(scheme, module.in_features, module.out_features, module.bias is not None, dtype)
        model.set_submodule(path, StoredLinear(module.in_features, module.out_features, tensors, **kernel))
        layout.converted += 1
        if module.in_features * module.out_features > layout.largest_in_out[0] * layout.largest_in_out[1]:
            layout.largest_in_out = (module.in_features, module.out_features)
    return layout


def _owner(model: Any, key: str, modules: dict[str, Any]) -> tuple[str, str]:
    """(module path, tensor name) of a model key: the deepest existing module that prefixes it."""
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        path = ".".join(parts[:cut])
        if path in modules:
            return path, ".".join(parts[cut:])
    return "", key


def apply_checkpoint(model: Any, tensors: dict[str, TensorSpec], scheme: Scheme | None) -> StoredLayout:
    """Give the meta model exactly the checkpoint's tensors (dtype and shape from its headers)."""
    rename = renamer(model)
    modules = dict(model.named_modules())
    layout = StoredLayout(method=scheme.method if scheme else None, description=scheme.describe() if scheme else "")
    by_module: dict[str, dict[str, TensorSpec]] = {}
    for key, spec in tensors.items():
        path, name = _owner(model, rename(key), modules)
        by_module.setdefault(path, {})[name] = spec
    kernel = _kernel(scheme)
    held: set[int] = set()
    for path, own in by_module.items():
        module = modules[path]
        plain = {n for n, _ in module.named_parameters(recurse=False)} | {
            n for n, _ in module.named_buffers(recurse=False)
        }
        if isinstance(module, torch.nn.Linear) and set(own) - plain:  # a quantized layout
            model.set_submodule(path, StoredLinear(module.in_features, module.out_features, own, **kernel))
            layout.converted += 1
            if module.in_features * module.out_features > layout.largest_in_out[0] * layout.largest_in_out[1]:
                layout.largest_in_out = (module.in_features, module.out_features)
            layout.checkpoint_bytes += _nbytes(own.values())
            continue
        for name, (shape, dtype) in own.items():
            current = getattr(module, name, None) if name in plain else None
            if isinstance(current, torch.Tensor) and current.untyped_storage()._cdata in held:
                continue  # a tied parameter met a second time: held once
            t = torch.empty(shape, dtype=getattr(torch, dtype), device=META)
            if isinstance(current, torch.nn.Parameter):
                current.data = t  # keeps the Parameter object, so ties stay ties
                held.add(current.untyped_storage()._cdata)
            elif name in plain:
                module.register_buffer(name, t)
            else:
                module.register_buffer(name.replace(".", "_"), t)
                layout.unmatched.append(f"{path}.{name}" if path else name)
            layout.checkpoint_bytes += _nbytes([(shape, dtype)])
        if isinstance(module, torch.nn.Linear):
            layout.kept.setdefault("stored unquantized", []).append(path)
    return layout


def _nbytes(specs: Any) -> int:
    total = 0
    for shape, dtype in specs:
        n = 1
        for d in shape:
            n *= d
        total += n * torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return total
