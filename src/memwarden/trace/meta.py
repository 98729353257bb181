"""Meta-device capture: the Trace a live run would record, without the memory.

The model is built from its config with every floating-point tensor on PyTorch's
``meta`` device (shapes and dtypes, no data), and transformers' own ``generate()``
runs on it. A TorchDispatchMode sees every aten op: each output storage it has not
seen is an ALLOC of ``storage.nbytes()`` bytes, and a weakref on the storage object
(whose lifetime is the storage's) records the FREE the moment the last tensor using
it dies, exactly when the CPU allocator would free it. The recorder stands in for
the native one, so the live capture's hooks (:class:`memwarden.trace.capture.Capture`)
and attribution rules (:mod:`memwarden.trace.attribution`) build the Trace: weights,
buffers and inputs are PREEXISTING, module paths give the modality, root calls give
the prefill/decode steps, tensors in the output cache are ``kv_cache``.

Placement rule: floating-point tensors live on ``meta``; integer and bool tensors
are real CPU tensors. Token ids, attention masks, position ids, image grids and
placeholder masks are small, and the model code reads their values (to find the
placeholders, build M-RoPE positions, split vision sequences, stop generating), so
they are computed for real from the request, as the live run computes them.

Accommodations (each one scoped to the capture; nothing is patched globally):

- Factories (``empty``, ``zeros``, ``arange``, ``full``, ``torch.tensor``, ...) put
  floating-point results on meta and integer/bool results on the CPU, whatever
  device the code asked for; a ``.to(device)`` that changes only the device is a
  no-op, as it is on a single-device run.
- An op mixing meta and CPU operands runs on meta (the CPU operands are viewed on
  meta, which allocates nothing).
- Values the model computes from floating-point data cannot be known: an integer
  or bool result of an op on meta data (``argmax`` of the logits, ``== 0`` on pixel
  values, ``isinf(...).any()``) is a real CPU tensor of zeros, and ``.item()`` of a
  meta tensor is 0. So generated tokens are token 0 (the pad id, ordinary text),
  and Idefics3's "is this image all padding" test sees real images. Each such
  answer is counted in ``metadata["meta_oracle"]`` by op.
- Boolean-mask indexing (``x[mask]``, ``index_put_``) takes its output shape from
  the real mask: the mask becomes ``nonzero()`` indices, whose temporary block is
  recorded as the CPU kernel allocates it.
- ``scaled_dot_product_attention`` on meta would take the math path; the CPU picks
  its backend with ``torch._fused_sdp_choice`` (asked here on tiny CPU stand-ins
  with the same dtypes and layout) and, for its flash kernel, allocates the output,
  the log-sum-exp, a per-thread work buffer
  (``threads x (q_split x kv_split + 2 q_split + q_split x head_dim)`` floats) and
  a float copy of a boolean mask; those blocks are recorded with the sizes of
  ``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``.
- Generation is greedy with ``eos_token_id=None``: the length criterion is the only
  stopping criterion, so exactly ``max_new_tokens`` decode steps run.

Other kernels' internal workspaces (oneDNN scratchpads, MKL) are invisible to both
this capture and the live CPU recorder. Time in a meta trace is the meta run's own
clock, advanced by at least 1 µs per event so that every event keeps its order.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from memwarden.trace.attribution import CaptureLog, StorageRecord
from memwarden.trace.capture import Capture
from memwarden.trace.model import Trace

__all__ = ["MetaCapture", "build_meta_model", "meta_inputs", "placement"]

aten = torch.ops.aten
META = torch.device("meta")
CPU = torch.device("cpu")
_ENTER, _EXIT, _ALLOC, _FREE = 2, 3, 0, 1
_FAKE_BASE = 1 << 44  # fake addresses of allocated blocks; preexisting ones sit above _PRE_BASE
_PRE_BASE = 1 << 52
_ALIGN = 64


def _is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def _tensors(values: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(values)[0] if isinstance(x, torch.Tensor)]


def _key(t: torch.Tensor) -> tuple[int, Any] | None:
    """(storage identity, storage object) of a dense tensor; None for tensors without storage."""
    try:
        st = t.untyped_storage()
    except (NotImplementedError, RuntimeError, TypeError):
        return None
    return st._cdata, st


def _data_bytes(t: torch.Tensor) -> int:
    try:
        return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
    except (NotImplementedError, RuntimeError, TypeError):
        return 0


# -- the recorder: native.cpp's interface, fed from Python ----------------------------------


@dataclass(eq=False)
class _Block:
    id: int
    ptr: int
    nbytes: int
    event: int  # row of its ALLOC event
    ref: Any = None  # weakref to the storage object; its callback records the FREE


class _Recorder:
    """Stands in for ``memwarden.trace.native``: ``now_ns``, ``enter``/``exit``, ``drain``."""

    _COLUMNS = ("time_ns", "ptr", "nbytes", "id", "ctx", "op_outer", "op_inner", "shape_off", "ndim", "dtype", "action", "written")

    def __init__(self) -> None:
        self._clock = 0
        self.recording = False
        self._cols: dict[str, list[int]] = {c: [] for c in self._COLUMNS}
        self._shapes: list[int] = []
        self._ctx: list[int] = []
        self._ops: list[str] = []
        self._op_ids: dict[str, int] = {}
        self._dtypes: list[str] = []
        self._dtype_ids: dict[torch.dtype, int] = {}
        self._next_id = 1
        self._next_pre = _PRE_BASE
        self.blocks: dict[int, _Block] = {}  # storage identity -> live block made during the capture
        self.preexisting: dict[int, tuple[int, Any]] = {}  # storage identity -> (fake ptr, weakref)
        self.oracle: Counter[str] = Counter()
        self.op: str | None = None  # outermost op running now (set by the dispatch mode)

    # native interface
    def now_ns(self) -> int:
        self._clock = max(time.perf_counter_ns(), self._clock + 1000)
        return self._clock

    def start(self, record_ops: bool = True) -> None:
        self.recording = True

    def stop(self) -> None:
        self.recording = False

    def enter(self, ctx: int) -> None:
        if self.recording:
            self._push(_ENTER, 0, 0, ctx)
            self._ctx.append(int(ctx))

    def exit(self, ctx: int) -> None:
        if not self.recording:
            return
        while self._ctx:
            if self._ctx.pop() == ctx:
                break
        self._push(_EXIT, 0, 0, ctx)

    def scalar_type_names(self) -> list[str]:
        return list(self._dtypes)

    def drain(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        types = {"time_ns": np.int64, "ptr": np.int64, "nbytes": np.int64, "id": np.int64, "ctx": np.int32,
                 "op_outer": np.int32, "op_inner": np.int32, "shape_off": np.int32, "ndim": np.int16,
                 "dtype": np.int16, "action": np.uint8, "written": np.int64}  # fmt: skip
        for name, values in self._cols.items():
            out[name] = np.asarray(values, dtype=types[name])
        out["shapes"] = np.asarray(self._shapes, dtype=np.int64)
        out["op_names"] = list(self._ops)
        out["untracked_frees"] = 0
        out["unwrapped_allocations"] = 0
        out["live_at_drain"] = len(self.blocks)
        return out

    # events
    def _intern_op(self, name: str | None) -> int:
        if name is None:
            return -1
        index = self._op_ids.get(name)
        if index is None:
            index = self._op_ids[name] = len(self._ops)
            self._ops.append(name)
        return index

    def _push(self, action: int, ptr: int, nbytes: int, ident: int, *, op: str | None = None) -> int:
        c = self._cols
        row = len(c["time_ns"])
        c["time_ns"].append(self.now_ns())
        c["ptr"].append(ptr)
        c["nbytes"].append(nbytes)
        c["id"].append(ident)
        c["ctx"].append(self._ctx[-1] if self._ctx else -1)
        op_id = self._intern_op(op or self.op)
        c["op_outer"].append(op_id)
        c["op_inner"].append(op_id)
        c["shape_off"].append(-1)
        c["ndim"].append(0)
        c["dtype"].append(-1)
        c["action"].append(action)
        c["written"].append(-1)
        return row

    def _dtype_id(self, dtype: torch.dtype) -> int:
        index = self._dtype_ids.get(dtype)
        if index is None:
            index = self._dtype_ids[dtype] = len(self._dtypes)
            self._dtypes.append(str(dtype).replace("torch.", ""))
        return index

    def alloc(self, nbytes: int, *, op: str | None, dtype: torch.dtype | None, shape: tuple[int, ...] | None,
              written: int = -1) -> _Block:  # fmt: skip
        """A block that no storage owns (a kernel's work buffer): free it with :meth:`free`."""
        ident = self._next_id
        self._next_id += 1
        ptr = _FAKE_BASE + ident * _ALIGN
        row = self._push(_ALLOC, ptr, nbytes, ident, op=op)
        c = self._cols
        if dtype is not None:
            c["dtype"][row] = self._dtype_id(dtype)
        if shape is not None:
            c["shape_off"][row] = len(self._shapes)
            c["ndim"][row] = len(shape)
            self._shapes.extend(int(d) for d in shape)
        c["written"][row] = written
        return _Block(ident, ptr, nbytes, row)

    def free(self, block: _Block) -> None:
        if self.recording:
            self._push(_FREE, block.ptr, block.nbytes, block.id)

    def note_storage(self, t: torch.Tensor, inputs: list[torch.Tensor], op: str | None) -> None:
        """Record the storage behind op output ``t`` if it is new (or was resized)."""
        found = _key(t)
        if found is None:
            return
        key, st = found
        nbytes = int(st.nbytes())
        block = self.blocks.get(key)
        if block is not None:
            if block.nbytes == nbytes:
                sources = sum(_data_bytes(x) for x in inputs if (k := _key(x)) is not None and k[0] != key)
                if sources and any((k := _key(x)) is not None and k[0] == key for x in inputs):
                    col = self._cols["written"]
                    col[block.event] = max(col[block.event], 0) + sources
                return
            # resized in place: the CPU allocator hands out a new block and frees the old one
            del self.blocks[key]
            block.ref = None
            self.free(block)
        elif key in self.preexisting or nbytes == 0:
            return
        sources = sum(_data_bytes(x) for x in inputs if (k := _key(x)) is not None and k[0] != key)
        block = self.alloc(nbytes, op=op, dtype=t.dtype, shape=tuple(t.shape), written=sources)
        self.blocks[key] = block

        def _freed(_ref: Any, key: int = key, block: _Block = block) -> None:
            if self.blocks.get(key) is block:
                del self.blocks[key]
                self.free(block)

        block.ref = weakref.ref(st, _freed)

    def note_preexisting(self, t: torch.Tensor, record: Callable[[int, int, torch.Tensor], StorageRecord]) -> int | None:
        """Give a storage alive before the capture a fake address; ``record`` files it in the log."""
        found = _key(t)
        if found is None:
            return None
        key, st = found
        if key in self.preexisting:
            return self.preexisting[key][0]
        ptr = self._next_pre
        self._next_pre += _ALIGN * max(1, -(-int(st.nbytes()) // _ALIGN))
        rec = record(ptr, int(st.nbytes()), t)
        clock = self.now_ns

        def _freed(_ref: Any, key: int = key) -> None:
            if key in self.preexisting:
                del self.preexisting[key]
                if self.recording:
                    rec.freed_ns = clock()

        self.preexisting[key] = (ptr, weakref.ref(st, _freed))
        return ptr

    def ptr_of(self, t: Any) -> int | None:
        if not isinstance(t, torch.Tensor):
            return None
        found = _key(t)
        if found is None:
            return None
        block = self.blocks.get(found[0])
        if block is not None:
            return block.ptr
        pre = self.preexisting.get(found[0])
        return pre[0] if pre is not None else None


class _MetaLog(CaptureLog):
    """CaptureLog whose tags find blocks by storage identity (meta tensors have no address)."""

    recorder: _Recorder

    def tag(self, t_ns: int, tensor: Any, kind: str, path: str) -> None:
        ptr = self.recorder.ptr_of(tensor)
        if ptr is not None:
            self.tags.append((t_ns, ptr, kind, path))

    def add_preexisting(self, tensor: torch.Tensor) -> None:
        def record(ptr: int, nbytes: int, t: torch.Tensor) -> StorageRecord:
            rec = StorageRecord(ptr, nbytes, str(t.dtype).replace("torch.", ""), tuple(t.shape), None, 0)
            if nbytes:
                self.preexisting_storages[ptr] = rec
            return rec

        self.recorder.note_preexisting(tensor, record)


# -- placement and recording ------------------------------------------------------------


def _schema_has_device(func: Any) -> bool:
    return any(a.name == "device" for a in func._schema.arguments)


def _on_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and not x.is_meta:
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=META)
    return x


def _zeros_like_meta(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros(t.shape, dtype=t.dtype, device=CPU)


class _DispatchMode(TorchDispatchMode):
    """Floats on meta, ints real; records every new storage into the recorder."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.rec = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        outer = self.rec.op
        if outer is None:
            self.rec.op = func._schema.name
        try:
            special = _SPECIAL.get(func)
            if special is not None:
                return special(self, func, args, kwargs)
            if func not in _CONVERSIONS and _is_composite(func):
                # In inference mode composite ops reach the mode whole; the CPU runs their
                # decomposition, whose intermediate blocks (layer_norm's mean/rstd) are real.
                with self:
                    return func.decompose(*args, **kwargs)
            return self.run(func, args, kwargs)
        finally:
            self.rec.op = outer

    # one op: placement, then recording of its outputs
    def run(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = self.call(func, args, kwargs)
        if self.rec.recording:
            inputs = _tensors((args, kwargs))
            for t in _tensors(out):
                self.rec.note_storage(t, inputs, self.rec.op)
        return out

    def call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        tensors = _tensors((args, kwargs))
        has_meta = any(t.is_meta for t in tensors)
        if func in _CONVERSIONS and tensors:
            dtype, device, copy = _CONVERSIONS[func](*args, **kwargs)
            return self.convert(args[0], dtype, device, copy)
        if not tensors:  # a factory: the result's dtype decides where it lives
            kw = dict(kwargs)
            if _schema_has_device(func):
                kw["device"] = META
            out = func(*args, **kw)
            if any(not _is_float(t.dtype) for t in _tensors(out)) and _schema_has_device(func):
                kw["device"] = CPU
                out = func(*args, **kw)
            return out
        if not has_meta:
            kw = dict(kwargs)
            if kw.get("device") is not None and torch.device(kw["device"]).type == "meta":
                kw["device"] = CPU
            out = func(*args, **kw)
            return tree_map(lambda x: _on_meta(x) if isinstance(x, torch.Tensor) and _is_float(x.dtype) and not _aliases(x, tensors) else x, out)
        # some operands on meta: run on meta
        originals: dict[int, torch.Tensor] = {}

        def to_meta(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and not x.is_meta:
                m = _on_meta(x)
                originals[id(m)] = x
                return m
            return x

        margs, mkw = tree_map(to_meta, (args, kwargs))
        if mkw.get("device") is not None:
            mkw["device"] = META
        out = func(*margs, **mkw)
        meta_inputs = _tensors((margs, mkw))

        def settle(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            for m in meta_inputs:  # written in place into a CPU operand: its values stay as they were
                if id(m) in originals and x is m:
                    return originals[id(m)]
            if _is_float(x.dtype) or _aliases(x, meta_inputs):
                return x
            self.rec.oracle[func._schema.name] += 1
            return _zeros_like_meta(x)

        return tree_map(settle, out)

    def convert(self, x: torch.Tensor, dtype: torch.dtype | None, device: Any, copy: bool) -> torch.Tensor:
        """``to`` / ``_to_copy`` on a one-device run: a device change alone is a no-op."""
        dtype = dtype or x.dtype
        if dtype == x.dtype:
            return aten.clone.default(x) if copy else aten.alias.default(x)
        if _is_float(dtype):
            return aten._to_copy.default(_on_meta(x), dtype=dtype, device=META)
        if x.is_meta:
            self.rec.oracle["aten::_to_copy"] += 1
            return torch.zeros(x.shape, dtype=dtype)
        return aten._to_copy.default(x, dtype=dtype, device=CPU)


def _to_device(self: Any, device: Any = None, dtype: Any = None, non_blocking: bool = False, copy: bool = False,
               memory_format: Any = None) -> tuple[Any, Any, bool]:  # fmt: skip
    return dtype, device, copy


def _to_dtype(self: Any, dtype: Any = None, non_blocking: bool = False, copy: bool = False, memory_format: Any = None) -> tuple[Any, Any, bool]:
    return dtype, None, copy


def _to_other(self: Any, other: Any, non_blocking: bool = False, copy: bool = False, memory_format: Any = None) -> tuple[Any, Any, bool]:
    return other.dtype, other.device, copy


def _to_kw(self: Any, *, dtype: Any = None, device: Any = None, copy: bool = False, **_: Any) -> tuple[Any, Any, bool]:
    return dtype, device, copy


def _to_copy_args(self: Any, *, dtype: Any = None, device: Any = None, **_: Any) -> tuple[Any, Any, bool]:
    # Outside inference mode ``Tensor.to`` reaches here only when something changes; a change of
    # device alone would not have happened on the live run's one device, so it copies nothing.
    moves = device is not None and torch.device(device).type != self.device.type
    return dtype, device, not moves


_CONVERSIONS: dict[Any, Callable[..., tuple[Any, Any, bool]]] = {
    aten.to.device: _to_device,
    aten.to.dtype: _to_dtype,
    aten.to.other: _to_other,
    aten.to.dtype_layout: _to_kw,
    aten._to_copy.default: _to_copy_args,
}


_COMPOSITE: dict[Any, bool] = {}


def _is_composite(func: Any) -> bool:
    found = _COMPOSITE.get(func)
    if found is None:
        found = _COMPOSITE[func] = torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
    return found


def _aliases(x: torch.Tensor, inputs: list[torch.Tensor]) -> bool:
    k = _key(x)
    if k is None:
        return False
    return any((j := _key(t)) is not None and j[0] == k[0] for t in inputs)


# -- ops that need their values or the CPU kernel's choices --------------------------------


def _local_scalar_dense(mode: _DispatchMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    if not x.is_meta:
        return func(*args, **kwargs)
    mode.rec.oracle["aten::_local_scalar_dense"] += 1
    if x.dtype == torch.bool:
        return False
    return 0.0 if _is_float(x.dtype) else 0


def _bool_indices(mode: _DispatchMode, indices: list[Any]) -> tuple[list[Any], list[Any]]:
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
                temps.append(mode.rec.alloc(nz.untyped_storage().nbytes(), op=None, dtype=nz.dtype, shape=tuple(nz.shape)))
            out.extend(nz.unbind(1))
        else:
            out.append(idx)
    return out, temps


def _index(mode: _DispatchMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    self_, indices = args[0], list(args[1])
    if not self_.is_meta or not any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
        return mode.run(func, args, kwargs)
    indices, temps = _bool_indices(mode, indices)
    out = mode.run(func, (self_, indices, *args[2:]), kwargs)
    for block in temps:
        mode.rec.free(block)
    return out


def _nonzero(mode: _DispatchMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not args[0].is_meta:
        return mode.run(func, args, kwargs)
    mode.rec.oracle["aten::nonzero"] += 1  # every element non-zero: the largest answer
    return mode.run(aten.nonzero.default, (torch.ones(args[0].shape, dtype=torch.bool),), {})


def _masked_select(mode: _DispatchMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    self_, mask = args[0], args[1]
    if not self_.is_meta or mask.is_meta:
        return mode.run(func, args, kwargs)
    count = int(torch.broadcast_to(mask, torch.broadcast_shapes(self_.shape, mask.shape)).sum())
    return mode.run(aten.empty.memory_format, ([count],), {"dtype": self_.dtype, "device": META})


def _sdpa(mode: _DispatchMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
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
        stand_in(q), stand_in(k), stand_in(v), stand_in(mask, ()), dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )
    if choice != int(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        mode.rec.oracle[f"sdpa backend {choice} (decomposed)"] += 1
        with mode:
            return func.decompose(*args, **kwargs)
    if mask is not None and mask.dtype == torch.bool:  # convert_boolean_attn_mask: where(mask, 0, -inf) in q's dtype
        zero = torch.zeros((), dtype=q.dtype, device=META)
        mask = mode.run(aten.where.self, (mask, zero, zero), {})
    out, lse = mode.run(
        aten._scaled_dot_product_flash_attention_for_cpu.default, (q, k, v, dropout_p, is_causal), {"attn_mask": mask, "scale": scale}
    )
    if mode.rec.recording:
        for block in _flash_work_buffers(mode.rec, q, k, v, mask):
            mode.rec.free(block)
    del lse, mask
    return out


def _flash_work_buffers(rec: _Recorder, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> list[_Block]:
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


def _convolution(mode: _DispatchMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A convolution plus the blocks the CPU backend allocates around its output (see _conv_pattern)."""
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

    geometry = (per_dim(bound["stride"]), per_dim(bound["padding"]), per_dim(bound["dilation"]), bool(bound["transposed"]),
                per_dim(bound["output_padding"]), int(bound["groups"]))  # fmt: skip
    pattern = _conv_pattern(tuple(x.shape), tuple(w.shape), bound.get("bias") is not None, geometry, w.dtype,
                            torch.get_num_threads())  # fmt: skip
    out_shape = _conv_out_shape(tuple(x.shape), tuple(w.shape), geometry)
    sizes = _conv_sizes(tuple(x.shape), tuple(w.shape), out_shape, geometry, w.element_size())
    live: dict[int, _Block] = {}
    out = None
    for is_alloc, block, kind in pattern:
        if kind == "out":
            out = mode.run(func, args, kwargs)
        elif is_alloc:
            nbytes = int(kind[6:]) if kind.startswith("bytes:") else sizes[kind]
            live[block] = mode.rec.alloc(nbytes, op=None, dtype=w.dtype, shape=None)
        elif block in live:
            mode.rec.free(live.pop(block))
    for block in live.values():
        mode.rec.free(block)
    return out if out is not None else mode.run(func, args, kwargs)


def _conv_out_shape(x: tuple[int, ...], w: tuple[int, ...], geometry: tuple[Any, ...]) -> tuple[int, ...]:
    stride, padding, dilation, transposed, output_padding, groups = geometry
    spatial = []
    for i, n in enumerate(x[2:]):
        k = w[2 + i]
        if transposed:
            spatial.append((n - 1) * stride[i] - 2 * padding[i] + dilation[i] * (k - 1) + output_padding[i] + 1)
        else:
            spatial.append((n + 2 * padding[i] - dilation[i] * (k - 1) - 1) // stride[i] + 1)
    channels = w[1] * groups if transposed else w[0]
    return (x[0], channels, *spatial)


def _conv_sizes(x: tuple[int, ...], w: tuple[int, ...], out: tuple[int, ...], geometry: tuple[Any, ...], elem: int) -> dict[str, int]:
    groups = geometry[5]
    columns = x[0] * (x[1] // groups) * int(np.prod(w[2:])) * int(np.prod(out[2:])) * groups  # im2col of the slow path
    return {
        "input": int(np.prod(x)) * elem,
        "weight": int(np.prod(w)) * elem,
        "out": int(np.prod(out)) * elem,
        "output": int(np.prod(out)) * elem,
        "columns": columns * elem,
    }


_PROBE_BYTES = 32 << 20  # a probe larger than this runs on one batch item


@functools.lru_cache(maxsize=256)
def _conv_pattern(x: tuple[int, ...], w: tuple[int, ...], has_bias: bool, geometry: tuple[Any, ...], dtype: torch.dtype,
                  threads: int) -> tuple[tuple[bool, int, str], ...]:  # fmt: skip
    """What the CPU convolution allocates, as (alloc?, block, kind) with kind in input/weight/columns/output
    (a same-sized copy of the output), ``bytes:N`` (a block of fixed size) and one "out" (the returned
    tensor).

    The backend (oneDNN or the im2col "slow" path) is the one PyTorch selects for these shapes
    (``torch._C._select_conv_backend`` on zero-stride stand-ins). oneDNN reorders the weight, the
    input (unless its layout suits the kernel) and the output into its blocked layouts; which of them
    it reorders depends on the CPU, so a probe runs the real convolution once on this CPU (on one
    batch item when the real one is large) under the native allocation recorder and classifies each
    block by its size. Without the recorder, oneDNN is assumed to reorder weight and output.
    """
    stride, padding, dilation, transposed, output_padding, groups = geometry
    elem = torch.empty((), dtype=dtype).element_size()

    def stand_in(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.empty((), dtype=dtype).expand(shape)

    def backend(xs: tuple[int, ...]) -> Any:
        bias = stand_in((w[1] * groups if transposed else w[0],)) if has_bias else None
        return torch._C._select_conv_backend(stand_in(xs), stand_in(w), bias, list(stride), list(padding), list(dilation),
                                             transposed, list(output_padding), groups, None)  # fmt: skip

    chosen = backend(x)
    probe_x = x
    if int(np.prod(x)) * elem + int(np.prod(_conv_out_shape(x, w, geometry))) * elem > _PROBE_BYTES and x[0] > 1:
        for batch in (1, 2):
            if backend((batch, *x[1:])) == chosen:
                probe_x = (batch, *x[1:])
                break
    found = _probe_conv(probe_x, w, has_bias, geometry, dtype)
    if found is None:
        name = str(chosen)
        if "Mkldnn" in name:
            return ((True, 0, "weight"), (True, 1, "output"), (False, 0, "weight"), (True, 2, "out"), (False, 1, "output"))
        if "Slow" in name:
            return ((True, 0, "columns"), (True, 1, "out"), (False, 0, "columns"))
        return ((True, 0, "out"),)
    return found


def _probe_conv(x: tuple[int, ...], w: tuple[int, ...], has_bias: bool, geometry: tuple[Any, ...],
                dtype: torch.dtype) -> tuple[tuple[bool, int, str], ...] | None:  # fmt: skip
    stride, padding, dilation, transposed, output_padding, groups = geometry
    try:
        from memwarden.trace import native

        recorder = native.load()
        if recorder.recording():
            return None  # a live capture is running: stay out of its log
    except Exception:  # no compiler, no headers: the formula above
        return None
    elem = torch.empty((), dtype=dtype).element_size()
    out_shape = _conv_out_shape(x, w, geometry)
    sizes = _conv_sizes(x, w, out_shape, geometry, elem)
    xt, wt = torch.zeros(x, dtype=dtype), torch.zeros(w, dtype=dtype)
    bt = torch.zeros(out_shape[1], dtype=dtype) if has_bias else None
    with torch.inference_mode():
        recorder.start(False)
        try:
            out = torch.ops.aten.convolution.default(xt, wt, bt, list(stride), list(padding), list(dilation), transposed,
                                                     list(output_padding), groups)  # fmt: skip
        finally:
            recorder.stop()
            drained = recorder.drain()
    action, nbytes, ident = (np.asarray(drained[k]) for k in ("action", "nbytes", "id"))
    out_bytes = out.untyped_storage().nbytes()
    del out
    freed = set(ident[action == 1].tolist())
    by_size = {sizes["out"]: "output", sizes["input"]: "input", sizes["weight"]: "weight", sizes["columns"]: "columns"}
    pattern: list[tuple[bool, int, str]] = []
    returned = False
    for a, nb, i in zip(action.tolist(), nbytes.tolist(), ident.tolist(), strict=True):
        if a == 0 and i not in freed and nb == out_bytes and not returned:
            pattern.append((True, i, "out"))
            returned = True
        elif a in (0, 1):
            # a size none of the tensors has (a weight padded to oneDNN's channel blocking) is kept as is
            pattern.append((a == 0, i, by_size.get(nb, f"bytes:{nb}")))
    if not returned:
        pattern.append((True, -1, "out"))
    return tuple(pattern)


def _native_layer_norm(mode: _DispatchMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
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


_SPECIAL: dict[Any, Callable[[_DispatchMode, Any, tuple[Any, ...], dict[str, Any]], Any]] = {
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
}


class _FunctionMode(TorchFunctionMode):
    """``torch.tensor(data, device=meta)`` copies below the dispatcher, losing integer values: keep them on CPU."""

    _CONSTRUCTORS = (torch.tensor, torch.as_tensor, torch.asarray)

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in self._CONSTRUCTORS or func is torch.Tensor.new_tensor:
            device = kwargs.get("device")
            if device is None and func is torch.Tensor.new_tensor:
                device = args[0].device
            if device is not None and torch.device(device).type == "meta":
                kw = dict(kwargs, device=CPU)
                out = func(*args, **kw)
                return out.to(META) if _is_float(out.dtype) else out
        return func(*args, **kwargs)


class placement:  # noqa: N801 (a context manager used like a function)
    """Floats on meta, integers on CPU, for building a model and running it (recording off)."""

    def __init__(self, recorder: _Recorder | None = None) -> None:
        self.recorder = recorder or _Recorder()
        self._modes = [_FunctionMode(), _DispatchMode(self.recorder)]

    def __enter__(self) -> placement:
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for m in reversed(self._modes):
            m.__exit__(*exc)


# -- models and inputs -----------------------------------------------------------------


def build_meta_model(config: Any, dtype: torch.dtype = torch.float32, model_class: str | None = None) -> torch.nn.Module:
    """Construct the transformers model of ``config`` with its weights on meta; eval mode, sdpa attention."""
    import transformers

    name = model_class or _model_class(config)
    cls = getattr(transformers, name)
    with placement(), torch.no_grad():
        model = cls._from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.generation_config.pad_token_id = 0
    return model.eval()


def _model_class(config: Any) -> str:
    from memwarden.models import zoo

    for name in zoo.NAMES:
        if zoo.spec(name).family == getattr(config, "model_type", None):
            return zoo.spec(name).model_class
    archs = getattr(config, "architectures", None) or []
    if archs:
        return str(archs[0])
    raise ValueError(f"no transformers class known for model_type {getattr(config, 'model_type', None)!r}")


def meta_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The request with its floating-point tensors (pixels, audio features) on meta."""
    return {k: (torch.empty_like(v, device=META) if _is_float(v.dtype) else v) for k, v in inputs.items()}


# -- the capture ------------------------------------------------------------------------


class MetaCapture(Capture):
    """``with MetaCapture(model, inputs) as cap: model.generate(**inputs, ...)`` on a meta model.

    ``model`` was built by :func:`build_meta_model`; ``inputs`` are the tensors the run
    will be given (recorded as PREEXISTING, like the live capture records them).
    """

    def __init__(self, model: torch.nn.Module, inputs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("metadata", {})
        kwargs["metadata"] = {"capture": "memwarden-meta", **kwargs["metadata"]}
        super().__init__(**kwargs)
        self._root = model
        self._inputs = dict(inputs or {})
        self._recorder = _Recorder()
        self._placement: placement | None = None

    def _scan_live_tensors(self) -> list[torch.Tensor]:
        return []  # nothing of a meta run lies in a mapped file

    def __enter__(self) -> MetaCapture:
        if self._active:
            raise RuntimeError("this capture is already running")
        rec = self._recorder
        self._native = rec
        log = _MetaLog()
        log.recorder = rec
        self._log = log
        self._t0 = self._now()
        log.clock = rec.now_ns
        self._wall0 = time.time()
        for t in list(self._root.parameters()) + list(self._root.buffers()):
            log.add_preexisting(t)
        for module in self._root.modules():  # plain tensor attributes (a rotary embedding's original_inv_freq)
            for value in vars(module).values():
                if isinstance(value, torch.Tensor):
                    log.add_preexisting(value)
        for t in _tensors(self._inputs):
            log.add_preexisting(t)
        self._register_root(self._root)
        rec.start()
        self._active = True
        for info in self._modules:
            module = info.ref()
            if module is not None and info.is_boundary:
                self._install_own_hooks(module)
        self._handles = [
            torch.nn.modules.module.register_module_forward_pre_hook(self._pre_hook_adapter),
            torch.nn.modules.module.register_module_forward_hook(self._post_hook_adapter, always_call=True),
        ]
        self._placement = placement(rec)
        self._placement.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._placement is not None:
            self._placement.__exit__(exc_type, exc, tb)
            self._placement = None
        self.stop()

    def stop(self) -> Trace:
        if self._active:
            self.metadata["meta_oracle"] = dict(self._recorder.oracle)
            self.metadata["threads"] = torch.get_num_threads()
        return super().stop()
