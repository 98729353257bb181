"""The aten ops a meta capture cannot run as they come: conversions, data-dependent shapes,
and CPU kernels whose work buffers a live run allocates (see :mod:`memwarden.record.meta.capture`).

Each handler takes the dispatch mode (``mode.run`` runs an op with placement and recording,
``mode.call`` with placement only, ``mode.rec`` is the recorder) and returns what the op
would have returned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from memwarden.record.meta.conv import conv_out_shape, conv_pattern, conv_sizes

aten = torch.ops.aten
META = torch.device("meta")
CPU = torch.device("cpu")

__all__ = [
    "CONVERSIONS",
    "SPECIAL",
    "Block",
    "aliases",
    "data_bytes",
    "is_composite",
    "is_float",
    "map_tensors",
    "on_meta",
    "storage_key",
    "tensors",
]


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


_TENSOR = torch._C.TensorBase  # a C-level isinstance check: torch.Tensor's goes through a Python metaclass
_LEAVES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format})


def tensors(values: Any) -> list[torch.Tensor]:
    """Tensors in nested tuples/lists/dicts (aten arguments and outputs nest at most two deep)."""
    # Hot path (every op, several times): size lists are full of ints, skip them by exact type.
    found: list[torch.Tensor] = []
    stack = [values]
    while stack:
        v = stack.pop()
        cls = type(v)
        if cls in _LEAVES:
            continue
        if cls is list or cls is tuple:
            stack.extend(v)
        elif isinstance(v, _TENSOR):
            found.append(v)  # type: ignore[arg-type]  # a TensorBase here is a torch.Tensor (tested at C speed)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return found


def map_tensors(fn: Callable[[Any], Any], values: Any) -> Any:
    """``fn`` applied to every tensor in nested tuples/lists/dicts, structure kept."""
    cls = type(values)
    if cls in _LEAVES:
        return values
    if isinstance(values, _TENSOR):
        return fn(values)
    if isinstance(values, tuple):
        return tuple(map_tensors(fn, v) for v in values)
    if isinstance(values, list):
        return [map_tensors(fn, v) for v in values]
    if isinstance(values, dict):
        return {k: map_tensors(fn, v) for k, v in values.items()}
    return values


def storage_key(t: torch.Tensor) -> tuple[int, Any] | None:
    """(storage identity, storage object) of a dense tensor; None for tensors without storage."""
    try:
        st = t.untyped_storage()
    except (NotImplementedError, RuntimeError, TypeError):
        return None
    return st._cdata, st


def data_bytes(t: torch.Tensor) -> int:
    try:
        return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
    except (NotImplementedError, RuntimeError, TypeError):
        return 0


@dataclass(eq=False)
class Block:
    """A block the recorder logged: its id, fake address and size."""

    id: int
    ptr: int
    nbytes: int
    event: int  # row of its ALLOC event
    ref: Any = None  # weakref to the storage object; its callback records the FREE


def schema_has_device(func: Any) -> bool:
    return any(a.name == "device" for a in func._schema.arguments)


def on_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and not x.is_meta:
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=META)
    return x


def zeros_on_cpu(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros(t.shape, dtype=t.dtype, device=CPU)


def _to_device(
    self: Any,
    device: Any = None,
    dtype: Any = None,
    non_blocking: bool = False,
    copy: bool = False,
    memory_format: Any = None,
) -> tuple[Any, Any, bool]:
    return dtype, device, copy


def _to_dtype(
    self: Any, dtype: Any = None, non_blocking: bool = False, copy: bool = False, memory_format: Any = None
) -> tuple[Any, Any, bool]:
    return dtype, None, copy


def _to_other(
    self: Any, other: Any, non_blocking: bool = False, copy: bool = False, memory_format: Any = None
) -> tuple[Any, Any, bool]:
    return other.dtype, other.device, copy


def _to_kw(self: Any, *, dtype: Any = None, device: Any = None, copy: bool = False, **_: Any) -> tuple[Any, Any, bool]:
    return dtype, device, copy


def _to_copy_args(self: Any, *, dtype: Any = None, device: Any = None, **_: Any) -> tuple[Any, Any, bool]:
    # Outside inference mode ``Tensor.to`` reaches here only when something changes; a change of
    # device alone would not have happened on the live run's one device, so it copies nothing.
    moves = device is not None and torch.device(device).type != self.device.type
    return dtype, device, not moves


CONVERSIONS: dict[Any, Callable[..., tuple[Any, Any, bool]]] = {
    aten.to.device: _to_device,
    aten.to.dtype: _to_dtype,
    aten.to.other: _to_other,
    aten.to.dtype_layout: _to_kw,
    aten._to_copy.default: _to_copy_args,
}


_COMPOSITE: dict[Any, bool] = {}


def is_composite(func: Any) -> bool:
    found = _COMPOSITE.get(func)
    if found is None:
        found = _COMPOSITE[func] = torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), "CompositeImplicitAutograd"
        )
    return found


def aliases(x: torch.Tensor, inputs: list[torch.Tensor]) -> bool:
    k = storage_key(x)
    if k is None:
        return False
    return any((j := storage_key(t)) is not None and j[0] == k[0] for t in inputs)


# -- ops that need their values or the CPU kernel's choices --------------------------------


def _local_scalar_dense(mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    if not x.is_meta:
        return func(*args, **kwargs)
    mode.rec.oracle["aten::_local_scalar_dense"] += 1
    if x.dtype == torch.bool:
        return False
    return 0.0 if is_float(x.dtype) else 0


def _bool_indices(mode: Any, indices: list[Any]) -> tuple[list[Any], list[Any]]:
    """Boolean masks -> long index tensors, as ``expandTensors`` does; returns (indices, temporaries)."""
    out: list[Any] = []
    temps: list[Any] = []
    for idx in indices:
        if isinstance(idx, torch.Tensor) and idx.dtype in (torch.bool, torch.uint8):
            if idx.is_meta:
                mode.rec.oracle["aten::nonzero"] += 1
                idx = torch.ones(idx.shape, dtype=torch.bool)
            nz = torch.nonzero(idx)  # (N, mask dims) int64, the kernel's temporary
            if mode.rec.recording:
                temps.append(
                    mode.rec.alloc(nz.untyped_storage().nbytes(), op=None, dtype=nz.dtype, shape=tuple(nz.shape))
                )
            out.extend(nz.unbind(1))
        else:
            out.append(idx)
    return out, temps


def _index(mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    self_, indices = args[0], list(args[1])
    if not self_.is_meta or not any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
    ):
        return mode.run(func, args, kwargs)
    indices, temps = _bool_indices(mode, indices)
    out = mode.run(func, (self_, indices, *args[2:]), kwargs)
    for block in temps:
        mode.rec.free(block)
    return out


def _nonzero(mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not args[0].is_meta:
        return mode.run(func, args, kwargs)
    mode.rec.oracle["aten::nonzero"] += 1  # every element non-zero: the largest answer
    return mode.run(aten.nonzero.default, (torch.ones(args[0].shape, dtype=torch.bool),), {})


def _masked_select(mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    self_, mask = args[0], args[1]
    if not self_.is_meta or mask.is_meta:
        return mode.run(func, args, kwargs)
    count = int(torch.broadcast_to(mask, torch.broadcast_shapes(self_.shape, mask.shape)).sum())
    return mode.run(aten.empty.memory_format, ([count],), {"dtype": self_.dtype, "device": META})


def _sdpa(mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The CPU's scaled_dot_product_attention: backend choice, mask conversion, flash work buffers."""
    names = [a.name for a in func._schema.arguments]
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    q, k, v = bound["query"], bound["key"], bound["value"]
    mask = bound.get("attn_mask")
    dropout_p = float(bound.get("dropout_p", 0.0) or 0.0)
    is_causal = bool(bound.get("is_causal", False))
    scale = bound.get("scale")
    enable_gqa = bool(bound.get("enable_gqa", False))
    if not q.is_meta:
        return mode.run(func, args, kwargs)

    def stand_in(t: torch.Tensor | None, keep: tuple[int, ...] = (1, -1)) -> torch.Tensor | None:
        # the backend choice reads dtypes, ranks, head counts and head sizes, not lengths
        if t is None:
            return None
        kept = {d % t.dim() for d in keep} if t.dim() else set()
        return torch.zeros([int(n) if i in kept else 1 for i, n in enumerate(t.shape)], dtype=t.dtype)

    choice = torch._fused_sdp_choice(
        stand_in(q),  # type: ignore[arg-type]
        stand_in(k),  # type: ignore[arg-type]
        stand_in(v),  # type: ignore[arg-type]
        stand_in(mask, ()),
        dropout_p,
        is_causal,
        scale=scale,
        enable_gqa=enable_gqa,
    )
    if choice != torch.nn.attention.SDPBackend.FLASH_ATTENTION.value:
        mode.rec.oracle[f"sdpa backend {choice} (decomposed)"] += 1
        with mode:
            return func.decompose(*args, **kwargs)
    if mask is not None and mask.dtype == torch.bool:  # convert_boolean_attn_mask: where(mask, 0, -inf) in q's dtype
        zero = torch.zeros((), dtype=q.dtype, device=META)
        mask = mode.run(aten.where.self, (mask, zero, zero), {})
    out, lse = mode.run(
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        (q, k, v, dropout_p, is_causal),
        {"attn_mask": mask, "scale": scale},
    )
    if mode.rec.recording:
        for block in _flash_work_buffers(mode.rec, q, k, v, mask):
            mode.rec.free(block)
    del lse, mask
    return out


def _flash_work_buffers(rec: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> list[Block]:
    """Per-thread buffers of ``cpu_flash_attention`` (FlashAttentionKernel.cpp), allocated then freed."""
    q_len, kv_len, head_dim = int(q.shape[2]), int(v.shape[2]), int(q.shape[3])
    q_split = 256 if q_len >= 768 else 64 if q_len >= 192 else 32
    q_split = min(q_split, q_len)
    kv_split = min(512, kv_len)
    threads = torch.get_num_threads()
    accum = torch.float32 if q.dtype in (torch.float16, torch.bfloat16, torch.float32) else q.dtype
    accum_bytes = torch.empty((), dtype=accum, device=META).element_size()
    per_thread = q_split * kv_split + 2 * q_split + q_split * head_dim
    blocks = [rec.alloc(threads * per_thread * accum_bytes, op=None, dtype=accum, shape=(threads, per_thread))]
    if q.dtype in (torch.float16, torch.bfloat16):  # buf_reduced: the scores in q's dtype
        nbytes = threads * q_split * kv_split * q.element_size()
        blocks.append(rec.alloc(nbytes, op=None, dtype=q.dtype, shape=(threads, q_split, kv_split)))
    return blocks


def _convolution(mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A convolution plus the blocks the CPU backend allocates around its output (see conv_pattern)."""
    names = [a.name for a in func._schema.arguments]
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    x, w = bound["input"], bound["weight"]
    if not (x.is_meta or w.is_meta) or not mode.rec.recording:
        return mode.run(func, args, kwargs)
    dims = x.dim() - 2

    def per_dim(v: Any) -> tuple[int, ...]:  # conv ops accept one value for every spatial dim
        values = tuple(int(e) for e in v)
        return values * dims if len(values) == 1 else values

    geometry = (
        per_dim(bound["stride"]),
        per_dim(bound["padding"]),
        per_dim(bound["dilation"]),
        bool(bound["transposed"]),
        per_dim(bound["output_padding"]),
        int(bound["groups"]),
    )
    pattern = conv_pattern(
        tuple(x.shape), tuple(w.shape), bound.get("bias") is not None, geometry, w.dtype, torch.get_num_threads()
    )
    out_shape = conv_out_shape(tuple(x.shape), tuple(w.shape), geometry)
    sizes = conv_sizes(tuple(x.shape), tuple(w.shape), out_shape, geometry, w.element_size())
    live: dict[int, Block] = {}
    out = None
    for is_alloc, block, kind in pattern:
        if kind == "out":
            out = mode.run(func, args, kwargs)
        elif is_alloc:
            nbytes = int(kind[6:]) if kind.startswith("bytes:") else sizes[kind]
            live[block] = mode.rec.alloc(nbytes, op=None, dtype=w.dtype, shape=None)
        elif block in live:
            mode.rec.free(live.pop(block))
    for leftover in live.values():
        mode.rec.free(leftover)
    return out if out is not None else mode.run(func, args, kwargs)


def _native_layer_norm(mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The CPU kernel keeps mean/rstd in a bfloat16/float16 input's dtype; the meta kernel makes them float32."""
    x = args[0]
    if not x.is_meta or x.dtype not in (torch.bfloat16, torch.float16):
        return mode.run(func, args, kwargs)
    out, mean, rstd = mode.call(func, args, kwargs)
    mean = torch.empty(mean.shape, dtype=x.dtype, device=META)
    rstd = torch.empty(rstd.shape, dtype=x.dtype, device=META)
    if mode.rec.recording:
        for t in (out, mean, rstd):
            mode.rec.note_storage(t, [x], mode.rec.op)
    return out, mean, rstd


def _histc(mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """transformers' grouped-mm MoE counts tokens per expert with ``histc`` on integer expert ids
    when its hidden states are not on the CPU (here they are on meta, the ids real on the CPU),
    and the CPU has no integer histc: count on float ids, as transformers does on the CPU
    (``integrations/moe.py``)."""
    x = args[0]
    if not x.is_meta and not is_float(x.dtype):
        args = (x.float(), *args[1:])
    return mode.run(func, args, kwargs)


SPECIAL: dict[Any, Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]] = {
    aten.native_layer_norm.default: _native_layer_norm,
    aten.convolution.default: _convolution,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.index.Tensor: _index,
    aten.index_put_.default: _index,
    aten.index_put.default: _index,
    aten._index_put_impl_.default: _index,
    aten.nonzero.default: _nonzero,
    aten.masked_select.default: _masked_select,
    aten.scaled_dot_product_attention.default: _sdpa,
    aten.histc.default: _histc,
}
