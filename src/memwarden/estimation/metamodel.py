"""The meta model of an estimate: built once per (config, dtype, quantization) and kept, with its
quantized storage emulated, and the facts about it that the arithmetic suggestions scale.

Quantized storage (see :mod:`memwarden.estimation.run` for what each option means) is emulated on the
meta model, so the capture records the bytes and temporaries of the quantized kernels without
any values: :class:`_QuantizedLinear` for weights, an emulated ``QuantizedLayer`` for the KV cache.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import torch

from memwarden.errors import InputError
from memwarden.estimation.card import ModelFacts, Request
from memwarden.estimation.stored import StoredLayout, StoredLinear
from memwarden.record.live.capture import before_live_capture
from memwarden.record.meta.capture import MetaCapture

if TYPE_CHECKING:
    from memwarden.estimation.resolve import ResolvedModel

__all__ = [
    "capture_for",
    "decoding_part",
    "kv_quantizable",
    "layout_for",
    "model_facts",
    "model_for",
    "quantized_cache",
]


_MODELS: OrderedDict[tuple[str, bool, str, str | None], Any] = OrderedDict()  # meta models cost no weights; keep a few
_LAYOUTS: dict[int, StoredLayout] = {}  # id(meta model) -> how its weights are stored
_MODELS_KEPT = 4


def model_for(resolved: ResolvedModel, dtype: str, weights_dtype: str | None) -> Any:
    """The meta model, its weights stored as the checkpoint stores them: every tensor of a local
    folder's safetensors headers, else the quantization_config's layout, else ``weights_dtype``."""
    from memwarden.estimation.stored import apply_checkpoint, apply_scheme
    from memwarden.record.meta.capture import build_meta_model

    if weights_dtype is not None and (resolved.scheme is not None or resolved.checkpoint is not None):
        what = resolved.scheme.describe() if resolved.scheme else "a checkpoint whose tensors set the weights"
        raise InputError(f"{resolved.name} is {what}; --weights-dtype applies to unquantized configs only")
    # a folder and its own config.json resolve to the same source; only the folder's headers set the weights
    key = (resolved.source, resolved.checkpoint is not None, dtype, weights_dtype)
    model = _MODELS.get(key)
    if model is None:
        model = build_meta_model(resolved.config, getattr(torch, dtype), resolved.model_class)
        if resolved.checkpoint is not None:
            _LAYOUTS[id(model)] = apply_checkpoint(model, resolved.checkpoint.tensors, resolved.scheme)
        elif resolved.scheme is not None:
            _LAYOUTS[id(model)] = apply_scheme(model, resolved.scheme, dtype)
        if weights_dtype is not None:
            _quantize_linears(model, weights_dtype)
        _MODELS[key] = model
        while len(_MODELS) > _MODELS_KEPT:
            _LAYOUTS.pop(id(_MODELS.popitem(last=False)[1]), None)
    _MODELS.move_to_end(key)
    return model


def forget_models() -> bool:
    """Drop the kept meta models; whether there were any. Their weights are on meta, but a few
    buffers (rotary ``inv_freq`` and the like) are real CPU tensors: a live capture in the same
    process would count them, so every live capture drops them as it starts."""
    kept = bool(_MODELS or _LAYOUTS)
    _MODELS.clear()
    _LAYOUTS.clear()
    return kept


before_live_capture(forget_models)


def layout_for(model: Any) -> StoredLayout | None:
    """How a meta model built by :func:`model_for` stores its weights; None: as built."""
    return _LAYOUTS.get(id(model))


def kv_quantizable(resolved: ResolvedModel) -> bool:
    text = resolved.config.get_text_config()
    layer_types = getattr(text, "layer_types", None) or []
    return all(t == "full_attention" for t in layer_types)


# -- the capture of a meta run ---------------------------------------------------------------------


def decoding_part(model: Any) -> Any:
    """The sub-model a model's own generate() hands the decoding to, or None.

    BLIP-2, InstructBLIP and Kosmos-2 override generate(): it encodes the image, then calls
    ``self.language_model.generate`` / ``self.text_model.generate`` with the image's embeddings, so
    the model's root is never called and the prefill and decode steps are that part's calls. Found
    as the one child that can generate and whose generate() the override's source calls."""
    import inspect

    from transformers import GenerationMixin, PreTrainedModel

    generate = type(model).generate
    if generate is GenerationMixin.generate:
        return None
    try:
        source = inspect.getsource(generate)
    except (OSError, TypeError):
        return None
    parts = [
        child
        for name, child in model.named_children()
        if isinstance(child, GenerationMixin)
        and isinstance(child, PreTrainedModel)
        and child.can_generate()
        and f"self.{name}.generate(" in source
    ]
    return parts[0] if len(parts) == 1 else None


def capture_for(model: Any, inputs: dict[str, Any], metadata: dict[str, Any]) -> MetaCapture:
    """The meta capture of ``model.generate(**inputs)``: its steps are the calls of the part that
    decodes (:func:`decoding_part`), else of the model."""
    return _EstimateCapture(model, inputs, decoding_part(model), metadata=metadata)


class _EstimateCapture(MetaCapture):
    """The meta capture, with two things the capture does not do yet for the families it serves:

    - ``part`` (a model whose generate() hands the decoding to a sub-model): the outermost calls of
      ``part`` are the steps, as root calls (a root's path is empty); the whole model's weights are
      still the run's and every other path (and so every modality) is unchanged.
    - An encoder-decoder's cache (Whisper's ``EncoderDecoderCache``) holds its layers in a
      self-attention and a cross-attention cache: both are tagged ``kv_cache`` after each step, as
      the capture tags a decoder-only model's cache.

    It reaches into the capture's module table, which has no public way to name the step module."""

    def __init__(self, model: Any, inputs: dict[str, Any], part: Any = None, **kwargs: Any) -> None:
        super().__init__(model, inputs, **kwargs)
        self._part = part

    def __enter__(self) -> _EstimateCapture:
        super().__enter__()
        ctx = self._module_ids.get(id(self._part)) if self._part is not None else None
        if ctx is not None:
            self._modules[ctx] = dataclasses.replace(self._modules[ctx], path="")
        return self

    def _post_hook(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        super()._post_hook(module, args, kwargs, output)
        ctx = self._module_ids.get(id(module))
        if ctx is None or self._stack or self._modules[ctx].path != "":
            return
        cache = next(
            (c for c in (getattr(output, n, None) for n in ("cache", "past_key_values")) if c is not None), None
        )
        now = self._now()
        for part in (getattr(cache, "self_attention_cache", None), getattr(cache, "cross_attention_cache", None)):
            for layer in getattr(part, "layers", None) or ():
                for name in ("keys", "values"):
                    t = getattr(layer, name, None)
                    if isinstance(t, torch.Tensor):
                        self._log.tag(now, t, "kv_cache", "")


# -- model facts for the arithmetic suggestions ----------------------------------------------------


def model_facts(resolved: ResolvedModel, model: Any, req: Request) -> ModelFacts:
    from memwarden.record.modality import ModalityRules
    from memwarden.trace.model import Modality

    def nbytes(module: Any) -> int:
        seen: dict[int, int] = {}
        for t in list(module.parameters()) + list(module.buffers()):
            st = t.untyped_storage()
            seen[st._cdata] = st.nbytes()
        return sum(seen.values())

    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if _is_linear(m) and m is not head]
    linear_bytes = sum(_weight_bytes(m) for m in linears)
    largest = max((_dense_bytes(m, req.dtype) for m in linears), default=0)
    rules = ModalityRules()
    stacks = [
        (path, m)
        for path, m in model.named_modules()
        if isinstance(m, torch.nn.ModuleList) and len(m) > 1 and rules.modality_of(path) == Modality.TEXT
    ]
    layers: Any = max(stacks, key=lambda pm: nbytes(pm[1]))[1] if stacks else []
    vc = getattr(resolved.config, "vision_config", None)
    merge = getattr(vc, "spatial_merge_size", None)
    patch = getattr(vc, "patch_size", None)
    # Dynamic resolution: a patch merger that takes any multiple of patch x merge (Qwen-VL style).
    multiple = patch * merge if isinstance(merge, int) and isinstance(patch, int) else None
    return ModelFacts(
        name=resolved.name,
        parameters=sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
        linear_weight_bytes=linear_bytes,
        largest_linear_bytes=largest,
        decoder_layers=len(layers),
        decoder_layer_bytes=max((nbytes(layer) for layer in layers), default=0),
        dtype_bytes=torch.empty((), dtype=getattr(torch, req.dtype)).element_size(),
        dynamic_resolution=multiple is not None,
        image_multiple_px=multiple,
    )


def _is_linear(module: Any) -> bool:
    return isinstance(module, (torch.nn.Linear, _QuantizedLinear, StoredLinear))


def _weight_bytes(module: Any) -> int:
    if isinstance(module, (_QuantizedLinear, StoredLinear)):
        return sum(int(b.untyped_storage().nbytes()) for b in module.buffers(recurse=False))
    return int(module.weight.untyped_storage().nbytes())


def _dense_bytes(module: Any, dtype: str) -> int:
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return int(module.out_features * module.in_features * elem)


# -- emulated quantized storage -------------------------------------------------------------------


class _QuantizedLinear(torch.nn.Module):
    """Weight-only quantized linear on meta: the bytes and temporaries of its kernel, no values."""

    def __init__(self, linear: torch.nn.Linear, bits: int) -> None:
        super().__init__()
        self.in_features, self.out_features, self.bits = linear.in_features, linear.out_features, bits
        weights = self.in_features * self.out_features
        meta = torch.device("meta")
        # codes: int8, or two 4-bit codes per byte; scales: fp32 per output row (int8) or per 64 weights (NF4)
        self.register_buffer("qweight", torch.empty(math.ceil(weights * bits / 8), dtype=torch.uint8, device=meta))
        scales = self.out_features if bits == 8 else math.ceil(weights / 64)
        self.register_buffer("scales", torch.empty(scales, dtype=torch.float32, device=meta))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.numel() // max(x.shape[-1], 1)
        if self.bits == 8 or tokens == 1:  # fused kernel: the output only
            out = x.new_empty((*x.shape[:-1], self.out_features))
            return out.add_(self.bias) if self.bias is not None else out
        weight = x.new_empty((self.out_features, self.in_features))  # the whole weight, dequantized
        return torch.nn.functional.linear(x, weight, self.bias)


def _quantize_linears(model: Any, weights_dtype: str) -> None:
    bits = {"int8": 8, "int4": 4}[weights_dtype]
    cls = _QuantizedLinear
    head = model.get_output_embeddings()
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear) and child is not head:
                setattr(parent, child_name, cls(child, bits))


def quantized_cache(resolved: ResolvedModel, kv_dtype: str) -> Any:
    from transformers.cache_utils import Cache, QuantizedCache, QuantizedLayer

    if not kv_quantizable(resolved):
        raise InputError(
            f"kv_dtype needs a model whose layers all use full attention; {resolved.name} has sliding-window layers"
        )
    if kv_dtype == "float8":
        return QuantizedCache("fp8", resolved.config)

    class EmulatedQuantizedLayer(QuantizedLayer):
        """quanto/hqq storage: nbits per value plus a scale and a zero point per group, on meta."""

        def _quantize(self, tensor: torch.Tensor, axis: int = 0) -> Any:
            numel = tensor.numel()
            codes = tensor.new_empty(math.ceil(numel * self.nbits / 8), dtype=torch.float8_e4m3fn)  # 1-byte stand-in
            params = tensor.new_empty(2 * math.ceil(numel / self.q_group_size), dtype=torch.float32)
            return codes, params, tuple(tensor.shape)

        def _dequantize(self, q_tensor: Any) -> torch.Tensor:
            codes, _params, shape = q_tensor
            dtype = self.keys.dtype if self.keys is not None else codes.dtype
            return codes.new_empty(shape, dtype=dtype)

    text = resolved.config.get_text_config(decoder=True)
    nbits = {"int8": 8, "int4": 4}[kv_dtype]
    return Cache(layers=[EmulatedQuantizedLayer(nbits=nbits) for _ in range(text.num_hidden_layers)])
