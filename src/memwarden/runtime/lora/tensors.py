"""Bytes <-> torch for adapter tensors, and a PEFT model's adapter parameters by saved name.

PEFT saves a LoRA layer's weights as ``<module path>.lora_A.weight`` / ``.lora_B.weight``
(``.lora_embedding_A`` / ``_B`` for embeddings) with the adapter name left out; in the live
model they sit at ``<module path>.lora_A.<adapter>.weight``. A module trained in full
(``modules_to_save``) is saved as ``<module path>.weight`` and lives at
``<module path>.modules_to_save.<adapter>.weight``. Names are compared in their
canonical form (``edge.sync.manifest.canonical_name``).
"""

from __future__ import annotations

import torch

from memwarden.edge.sync.manifest import AdapterFormatError, RawTensor, canonical_name
from memwarden.record.inputs import host_array

__all__ = ["adapter_parameters", "check_fits", "from_raw", "logical_view", "padded", "rank_dim", "to_raw"]

TORCH_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
SAFETENSORS_DTYPES = {v: k for k, v in TORCH_DTYPES.items()}
# The LoRA matrices whose rank a slot may zero-pad, and which of their dimensions is the rank.
_RANK_DIM = {".lora_A.weight": 0, ".lora_embedding_A": 0, ".lora_B.weight": 1, ".lora_embedding_B": 1}


def rank_dim(name: str) -> int | None:
    """The rank dimension of a LoRA A/B matrix named ``name``; None for every other tensor (a
    ``modules_to_save`` weight, a bias, a DoRA magnitude), which must keep its shape exactly."""
    return next((d for suffix, d in _RANK_DIM.items() if name.endswith(suffix)), None)


def check_fits(name: str, raw: RawTensor, slot: torch.Tensor) -> None:
    """``raw`` can be laid into ``slot`` (same dtype; same shape, or a lower LoRA rank), checked on
    the bytes' description before any tensor is made of them. ``AdapterFormatError`` otherwise."""
    dtype = TORCH_DTYPES.get(raw.dtype)
    if dtype is None or dtype != slot.dtype:
        raise AdapterFormatError(f"tensor {name!r}: dtype {raw.dtype}, the model holds {slot.dtype}")
    _check_shape(name, tuple(raw.shape), tuple(slot.shape))


def _check_shape(name: str, shape: tuple[int, ...], held: tuple[int, ...]) -> None:
    if shape == held:
        return
    dim = rank_dim(name)
    if dim is None or len(shape) != 2 or len(held) != 2 or shape[1 - dim] != held[1 - dim] or shape[dim] > held[dim]:
        raise AdapterFormatError(
            f"tensor {name!r}: shape {shape} does not fit the model's {held} "
            "(only a LoRA A/B matrix may carry a lower rank; anything else needs a new adapter slot, not a hot swap)"
        )


def to_raw(t: torch.Tensor) -> RawTensor:
    """The tensor's bytes (little-endian, row-major) as safetensors stores them."""
    dtype = SAFETENSORS_DTYPES.get(t.dtype)
    if dtype is None:
        raise AdapterFormatError(f"dtype {t.dtype} has no safetensors name")
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    # not Tensor.numpy(): it would mark the live adapter weight's storage non-resizable for good
    view = host_array(flat.view(torch.uint8)) if flat.numel() else None
    return RawTensor(dtype=dtype, shape=tuple(t.shape), data=view.tobytes() if view is not None else b"")


def from_raw(raw: RawTensor) -> torch.Tensor:
    """A CPU tensor holding a copy of ``raw``'s bytes."""
    dtype = TORCH_DTYPES.get(raw.dtype)
    if dtype is None:
        raise AdapterFormatError(f"dtype {raw.dtype} cannot be applied to a model (no torch dtype here)")
    if not raw.data:
        return torch.empty(raw.shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(raw.data), dtype=torch.uint8)
    return flat.view(dtype).reshape(raw.shape)


def padded(name: str, value: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """``value`` laid into a tensor of ``slot``'s shape: the same shape, or a lower LoRA rank
    zero-padded (A: (r, in) gets zero rows, B: (out, r) zero columns) so the module, and any
    graph compiled over it, keep their shapes. Zero rows of A meet zero columns of B: the
    output is that of the unpadded adapter."""
    if value.dtype != slot.dtype:
        raise AdapterFormatError(f"tensor {name!r}: dtype {value.dtype}, the model holds {slot.dtype}")
    if value.shape == slot.shape:
        return value
    _check_shape(name, tuple(value.shape), tuple(slot.shape))
    out = torch.zeros_like(slot, device="cpu")
    if rank_dim(name) == 0:
        out[: value.shape[0]] = value
    else:
        out[:, : value.shape[1]] = value
    return out


def logical_view(name: str, param: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The part of a (possibly rank-padded) parameter that holds an adapter tensor of ``shape``."""
    if tuple(param.shape) == shape:
        return param
    if rank_dim(name) == 0:
        return param[: shape[0]]
    return param[:, : shape[1]]


def adapter_parameters(model: torch.nn.Module, adapter_name: str = "default") -> dict[str, torch.nn.Parameter]:
    """The model's LoRA parameters of ``adapter_name``, by canonical saved name."""
    found: dict[str, torch.nn.Parameter] = {}
    for path, module in model.named_modules():
        for attr in ("lora_A", "lora_B"):
            holder = getattr(module, attr, None)
            if isinstance(holder, torch.nn.ModuleDict) and adapter_name in holder:
                for kind in ("weight", "bias"):  # a bias only with PEFT's lora_bias=True
                    param = getattr(holder[adapter_name], kind, None)
                    if isinstance(param, torch.nn.Parameter):
                        found[canonical_name(f"{path}.{attr}.{kind}")] = param
        holder = getattr(module, "lora_magnitude_vector", None)  # DoRA: saved without ".weight"
        if isinstance(holder, torch.nn.ModuleDict) and adapter_name in holder:
            weight = getattr(holder[adapter_name], "weight", None)
            if isinstance(weight, torch.nn.Parameter):
                found[canonical_name(f"{path}.lora_magnitude_vector")] = weight
        for attr in ("lora_embedding_A", "lora_embedding_B"):
            holder = getattr(module, attr, None)
            if isinstance(holder, torch.nn.ParameterDict) and adapter_name in holder:
                found[canonical_name(f"{path}.{attr}")] = holder[adapter_name]
        # ``modules_to_save`` (PEFT's ModulesToSaveWrapper: e.g. an ``lm_head`` trained in full)
        # is saved under the wrapped module's own names: ``<path>.weight``.
        holder = getattr(module, "modules_to_save", None)
        if isinstance(holder, torch.nn.ModuleDict) and adapter_name in holder:
            for name, param in holder[adapter_name].named_parameters():
                found[canonical_name(f"{path}.{name}")] = param
    if not found:
        raise AdapterFormatError(f"the model has no LoRA parameters of adapter {adapter_name!r}")
    return found
