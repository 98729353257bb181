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

Accommodations (each one scoped to the capture by the dispatch and function modes;
nothing is patched globally; the op handlers live in :mod:`memwarden.trace.meta_ops`):

- Factories (``empty``, ``zeros``, ``arange``, ``full``, ...) put floating-point
  results on meta and integer/bool results on the CPU, whatever device the code asked
  for. ``torch.tensor(ints, device=meta)`` copies below the dispatcher, so a function
  mode keeps it on the CPU. During the capture a float of at most 64 KiB made by a
  factory or computed from CPU integers stays real too, so that integer -> float ->
  integer arithmetic keeps its values (Qwen2-VL's ``(arange(t) * interval).long()``
  temporal positions, Idefics3's ``bucketize`` of float aranges for patch positions).
  Weights (made while building) are always meta.
- ``.to(device)`` that changes only the device is a no-op (an alias), as it is on the
  live run's one device; ``.to(copy=True)`` copies; a dtype change casts.
- An op mixing meta and CPU operands runs on meta (the CPU operands are viewed on
  meta, which allocates nothing).
- Values the model computes from floating-point data cannot be known: an integer
  or bool result of an op on meta data is a real CPU tensor of zeros, and ``.item()``
  of a meta tensor is 0. Generated tokens (``argmax`` of the logits) are token 0, the
  pad id, an ordinary text token; Idefics3's "is this image all padding" test
  (``pixel_values == 0``) sees real images. Each such answer is counted in
  ``metadata["meta_oracle"]`` by op: on the zoo only these two occur.
- Boolean-mask indexing (``x[mask]``, ``index_put_``: LLaVA's placeholder check,
  Idefics3's image selection) takes its output shape from the real mask: the mask
  becomes ``nonzero()`` indices, whose temporary block is recorded as the CPU kernel
  allocates it.
- In inference mode composite ops (``linear``, ``layer_norm``, ``conv2d``) reach the
  mode whole; they are decomposed under the mode, as the CPU runs them, so their
  intermediate blocks (layer_norm's mean and rstd) are recorded. For bf16/fp16 the
  CPU keeps layer_norm's mean/rstd in the input dtype, the meta kernel in float32:
  the recorded blocks use the CPU's dtype.
- ``scaled_dot_product_attention`` on meta would take the math path; the CPU picks
  its backend with ``torch._fused_sdp_choice`` (asked here on tiny CPU stand-ins
  with the same dtypes, ranks and head sizes) and, for its flash kernel, allocates
  the output, the log-sum-exp, a per-thread work buffer
  (``threads x (q_split x kv_split + 2 q_split + q_split x head_dim)`` floats, plus
  the scores in the input dtype for bf16/fp16) and a float copy of a boolean mask;
  those blocks are recorded with the sizes of
  ``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``.
- Convolutions (patch embeddings, Whisper's mel convolutions): the CPU backend
  (oneDNN or im2col) reorders weight, input and output into its own layouts around
  the returned tensor; which ones depends on the CPU, so the real convolution runs
  once per shape on tiny zero tensors (one batch item when the real input is large)
  under the native recorder and the blocks it allocates are replayed at full size.
- Plain tensor attributes of modules (a rotary embedding's ``original_inv_freq``) are
  PREEXISTING like parameters and buffers; a quantized cache's
  ``_quantized_keys``/``_quantized_values`` are tagged ``kv_cache``.
- Generation is greedy with ``eos_token_id=None``: the length criterion is the only
  stopping criterion, so exactly ``max_new_tokens`` decode steps run.

What it does not see: internal workspaces that neither this capture nor the live CPU
recorder sees (MKL), and ones the live recorder does see but are not modelled here:
oneDNN scratchpads of bf16/fp16 matmuls on the CPU (tens to hundreds of KiB per call),
8-byte wrapped-scalar tensors and reduction accumulators. Time in a meta trace is the
meta run's own clock, advanced by at least 1 µs per event so that every event keeps
its order.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from memwarden.trace.attribution import CaptureLog, StorageRecord
from memwarden.trace.capture import Capture
from memwarden.trace.inputs import _cache_in
from memwarden.trace.meta_ops import (
    CONVERSIONS,
    SPECIAL,
    Block,
    aliases,
    data_bytes,
    is_composite,
    is_float,
    map_tensors,
    on_meta,
    schema_has_device,
    storage_key,
    tensors,
    zeros_on_cpu,
)
from memwarden.trace.model import Trace

__all__ = ["MetaCapture", "build_meta_model", "meta_inputs", "placement"]

aten = torch.ops.aten
META = torch.device("meta")
CPU = torch.device("cpu")
_ENTER, _EXIT, _ALLOC, _FREE = 2, 3, 0, 1
_FAKE_BASE = 1 << 44  # fake addresses of allocated blocks; preexisting ones sit above _PRE_BASE
_PRE_BASE = 1 << 52
_ALIGN = 64
_SMALL_FLOAT_BYTES = 64 * 1024  # a float computed from CPU integers stays real up to this size


class _Recorder:
    """Stands in for ``memwarden.trace.native``: ``now_ns``, ``enter``/``exit``, ``drain``."""

    _COLUMNS = (
        "time_ns",
        "ptr",
        "nbytes",
        "id",
        "ctx",
        "op_outer",
        "op_inner",
        "shape_off",
        "ndim",
        "dtype",
        "action",
        "written",
    )

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
        self.blocks: dict[int, Block] = {}  # storage identity -> live block made during the capture
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
              written: int = -1) -> Block:  # fmt: skip
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
        return Block(ident, ptr, nbytes, row)

    def free(self, block: Block) -> None:
        if self.recording:
            self._push(_FREE, block.ptr, block.nbytes, block.id)

    def note_storage(self, t: torch.Tensor, inputs: list[torch.Tensor], op: str | None) -> None:
        """Record the storage behind op output ``t`` if it is new (or was resized)."""
        found = storage_key(t)
        if found is None:
            return
        key, st = found
        nbytes = int(st.nbytes())
        block = self.blocks.get(key)
        if block is not None:
            if block.nbytes == nbytes:
                sources = sum(data_bytes(x) for x in inputs if (k := storage_key(x)) is not None and k[0] != key)
                if sources and any((k := storage_key(x)) is not None and k[0] == key for x in inputs):
                    col = self._cols["written"]
                    col[block.event] = max(col[block.event], 0) + sources
                return
            # resized in place: the CPU allocator hands out a new block and frees the old one
            del self.blocks[key]
            block.ref = None
            self.free(block)
        elif key in self.preexisting or nbytes == 0:
            return
        sources = sum(data_bytes(x) for x in inputs if (k := storage_key(x)) is not None and k[0] != key)
        block = self.alloc(nbytes, op=op, dtype=t.dtype, shape=tuple(t.shape), written=sources)
        self.blocks[key] = block

        def _freed(_ref: Any, key: int = key, block: Block = block) -> None:
            if self.blocks.get(key) is block:
                del self.blocks[key]
                self.free(block)

        block.ref = weakref.ref(st, _freed)

    def note_preexisting(
        self, t: torch.Tensor, record: Callable[[int, int, torch.Tensor], StorageRecord]
    ) -> int | None:
        """Give a storage alive before the capture a fake address; ``record`` files it in the log."""
        found = storage_key(t)
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
        found = storage_key(t)
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


class _DispatchMode(TorchDispatchMode):
    """Floats on meta, ints real; records every new storage into the recorder."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.rec = recorder

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        outer = self.rec.op
        if outer is None:
            self.rec.op = func._schema.name
        try:
            special = SPECIAL.get(func)
            if special is not None:
                return special(self, func, args, kwargs)
            if func not in CONVERSIONS and is_composite(func):
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
            inputs = tensors((args, kwargs))
            for t in tensors(out):
                self.rec.note_storage(t, inputs, self.rec.op)
        return out

    def call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        operands = tensors((args, kwargs))
        has_meta = any(t.is_meta for t in operands)
        if func in CONVERSIONS and operands:
            dtype, device, copy = CONVERSIONS[func](*args, **kwargs)
            return self.convert(args[0], dtype, device, copy)
        if not operands:  # a factory: the result's dtype decides where it lives
            kw = dict(kwargs)
            if schema_has_device(func):
                kw["device"] = META
            out = func(*args, **kw)
            made = tensors(out)
            # Integers are real; so are small floats made while recording (Idefics3 buckets patch
            # positions with float aranges). Weights, made while building, are always meta.
            small = self.rec.recording and all(t.numel() * t.element_size() <= _SMALL_FLOAT_BYTES for t in made)
            if schema_has_device(func) and (any(not is_float(t.dtype) for t in made) or small):
                kw["device"] = CPU
                out = func(*args, **kw)
            return out
        if not has_meta:
            kw = dict(kwargs)
            if kw.get("device") is not None and torch.device(kw["device"]).type == "meta":
                kw["device"] = CPU
            out = func(*args, **kw)

            def settle_cpu(x: torch.Tensor) -> torch.Tensor:
                # A small float computed from integers keeps its values (``(arange(t) * 0.5).long()``
                # must give positions); a large one moves to meta.
                large = x.numel() * x.element_size() > _SMALL_FLOAT_BYTES
                return on_meta(x) if is_float(x.dtype) and large and not aliases(x, operands) else x

            return map_tensors(settle_cpu, out)
        # some operands on meta: run on meta
        originals: dict[int, torch.Tensor] = {}

        def to_meta(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and not x.is_meta:
                m = on_meta(x)
                originals[id(m)] = x
                return m
            return x

        margs, mkw = map_tensors(to_meta, (args, kwargs))
        if mkw.get("device") is not None:
            mkw["device"] = META
        out = func(*margs, **mkw)
        meta_inputs = tensors((margs, mkw))

        def settle(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            for m in meta_inputs:  # written in place into a CPU operand: its values stay as they were
                if id(m) in originals and x is m:
                    return originals[id(m)]
            if is_float(x.dtype) or aliases(x, meta_inputs):
                return x
            self.rec.oracle[func._schema.name] += 1
            return zeros_on_cpu(x)

        return map_tensors(settle, out)

    def convert(self, x: torch.Tensor, dtype: torch.dtype | None, device: Any, copy: bool) -> torch.Tensor:
        """``to`` / ``_to_copy`` on a one-device run: a device change alone is a no-op."""
        dtype = dtype or x.dtype
        if dtype == x.dtype:
            return aten.clone.default(x) if copy else aten.alias.default(x)
        if is_float(dtype):
            return aten._to_copy.default(on_meta(x), dtype=dtype, device=META)
        if x.is_meta:
            self.rec.oracle["aten::_to_copy"] += 1
            return torch.zeros(x.shape, dtype=dtype)
        return aten._to_copy.default(x, dtype=dtype, device=CPU)


class _FunctionMode(TorchFunctionMode):
    """``torch.tensor(data, device=meta)`` copies below the dispatcher, losing integer values: keep them on CPU."""

    _CONSTRUCTORS = (torch.tensor, torch.as_tensor, torch.asarray)

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in self._CONSTRUCTORS or func is torch.Tensor.new_tensor:
            device = kwargs.get("device")
            if device is None and func is torch.Tensor.new_tensor:
                device = args[0].device
            if device is not None and torch.device(device).type == "meta":
                kw = dict(kwargs, device=CPU)
                out = func(*args, **kw)
                return out.to(META) if is_float(out.dtype) else out
        return func(*args, **kwargs)


class placement:  # noqa: N801 (a context manager used like a function)
    """Floats on meta, integers on CPU, for building a model and running it (recording off)."""

    def __init__(self, recorder: _Recorder | None = None) -> None:
        self.recorder = recorder or _Recorder()
        self._modes: list[Any] = [_FunctionMode(), _DispatchMode(self.recorder)]

    def __enter__(self) -> placement:
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for m in reversed(self._modes):
            m.__exit__(*exc)


# -- models and inputs -----------------------------------------------------------------


def build_meta_model(
    config: Any, dtype: torch.dtype = torch.float32, model_class: str | None = None
) -> torch.nn.Module:
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
    return {k: (torch.empty_like(v, device=META) if is_float(v.dtype) else v) for k, v in inputs.items()}


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
        for t in tensors(self._inputs):
            log.add_preexisting(t)
        self._register_root(self._root)
        rec.start()
        self._active = True
        for info in self._modules:
            hooked = info.ref()
            if hooked is not None and info.is_boundary:
                self._install_own_hooks(hooked)
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

    def _post_hook(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        super()._post_hook(module, args, kwargs, output)
        ctx = self._module_ids.get(id(module))
        if ctx is None or self._stack or self._modules[ctx].path != "":
            return
        # A quantized cache keeps its states in ``_quantized_keys``/``_quantized_values``, which the
        # live capture's cache scan does not read: tag them as KV cache too.
        cache = _cache_in(output)
        now = self._now()
        for layer in getattr(cache, "layers", None) or ():
            for name in ("_quantized_keys", "_quantized_values"):
                for t in tensors(getattr(layer, name, None)):
                    self._log.tag(now, t, "kv_cache", "")

    def stop(self) -> Trace:
        if self._active:
            self.metadata["meta_oracle"] = dict(self._recorder.oracle)
            self.metadata["threads"] = torch.get_num_threads()
        return super().stop()
