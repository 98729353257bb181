"""Meta-device capture: the Trace a live run would record, without the memory.

The model is built from its config with every floating-point tensor on PyTorch's
``meta`` device (shapes and dtypes, no data), and transformers' own ``generate()``
runs on it. A TorchDispatchMode sees every aten op: each output storage it has not
seen is an ALLOC of ``storage.nbytes()`` bytes, and a weakref on the storage object
(whose lifetime is the storage's) records the FREE the moment the last tensor using
it dies, exactly when the CPU allocator would free it
(:mod:`memwarden.record.meta.recorder`). The recorder stands in for
the native one, so the live capture's hooks (:class:`memwarden.record.live.capture.Capture`)
and attribution rules (:mod:`memwarden.record.attribution`) build the Trace: weights,
buffers and inputs are PREEXISTING, module paths give the modality, root calls give
the prefill/decode steps, tensors in the output cache are ``kv_cache``.

Placement rule: floating-point tensors live on ``meta``; integer and bool tensors
are real CPU tensors. Token ids, attention masks, position ids, image grids and
placeholder masks are small, and the model code reads their values (to find the
placeholders, build M-RoPE positions, split vision sequences, stop generating), so
they are computed for real from the request, as the live run computes them.

Accommodations (each one scoped to the capture by the dispatch and function modes;
nothing is patched globally; the op handlers live in :mod:`memwarden.record.meta.ops`):

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

Cost: a 7B model makes tens of thousands of ops per request, so the mode answers repeats from
memory: a meta kernel seen with the same operand metadata is not run again
(:mod:`memwarden.record.meta.memo`), and a composite op seen with the same operands replays its
decomposition's events instead of decomposing again (:mod:`memwarden.record.meta.replay`). Both
keep the recorded events exactly as a full run makes them.

What it does not see: internal workspaces that neither this capture nor the live CPU
recorder sees (MKL), and ones the live recorder does see but are not modelled here:
oneDNN scratchpads of bf16/fp16 matmuls on the CPU (tens to hundreds of KiB per call),
8-byte wrapped-scalar tensors and reduction accumulators. Time in a meta trace is the
meta run's own clock, advanced by at least 1 µs per event so that every event keeps
its order.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from memwarden.record.inputs import cache_in
from memwarden.record.live.capture import Capture
from memwarden.record.meta.memo import MetaMemo
from memwarden.record.meta.ops import (
    CONVERSIONS,
    SPECIAL,
    aliases,
    is_composite,
    is_float,
    map_tensors,
    on_meta,
    schema_has_device,
    tensors,
    zeros_on_cpu,
)
from memwarden.record.meta.recorder import MetaLog, Recorder
from memwarden.record.meta.replay import Replay
from memwarden.trace.model import Trace

__all__ = ["MetaCapture", "build_meta_model", "meta_inputs", "placement"]

aten = torch.ops.aten
META = torch.device("meta")
CPU = torch.device("cpu")
_SMALL_FLOAT_BYTES = 64 * 1024  # a float computed from CPU integers stays real up to this size
# id(op) -> (op, name, special handler, conversion, composite?, has a device argument?), looked up
# once per dispatch: OpOverload hashes in Python, an id does not (the tuple keeps the op alive).
_OPS: dict[int, tuple[Any, str, Any, Any, bool, bool]] = {}


def _op_info(func: Any) -> tuple[Any, str, Any, Any, bool, bool]:
    conversion = CONVERSIONS.get(func)
    info = (
        func,
        func._schema.name,
        SPECIAL.get(func),
        conversion,
        conversion is None and is_composite(func),
        schema_has_device(func),
    )
    _OPS[id(func)] = info
    return info


class _DispatchMode(TorchDispatchMode):
    """Floats on meta, ints real; records every new storage into the recorder."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.rec = recorder
        self.memo = MetaMemo()
        self.replay = Replay()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Otherwise TorchDispatchMode wraps __torch_dispatch__ in torch._dynamo.disable, whose frame
        # bookkeeping costs more per op than the handler; a meta capture never runs under compile.
        return False

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        info = _OPS.get(id(func)) or _op_info(func)
        rec = self.rec
        outer = rec.op
        if outer is None:
            rec.op = info[1]
        try:
            if info[2] is not None:  # special
                return info[2](self, func, args, kwargs)
            if info[4]:
                # In inference mode composite ops reach the mode whole; the CPU runs their
                # decomposition, whose intermediate blocks (layer_norm's mean/rstd) are real.
                if rec.recording and torch.is_inference_mode_enabled():
                    return self.replay.run(self, func, args, kwargs, tensors((args, kwargs)))
                with self:
                    return func.decompose(*args, **kwargs)
            return self.run(func, args, kwargs)
        finally:
            rec.op = outer

    # one op: placement, then recording of its outputs
    def run(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        operands = tensors((args, kwargs))
        out = self._place(func, args, kwargs, operands)
        rec = self.rec
        if rec.recording:
            made = [out] if isinstance(out, torch.Tensor) else tensors(out)
            if made:
                rec.note_outputs(made, operands, rec.op)
        return out

    def call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._place(func, args, kwargs, tensors((args, kwargs)))

    def _place(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], operands: list[torch.Tensor]) -> Any:
        info = _OPS.get(id(func)) or _op_info(func)
        if info[3] is not None and operands:  # a conversion
            dtype, device, copy = info[3](*args, **kwargs)
            return self.convert(args[0], dtype, device, copy)
        has_device = info[5]
        if not operands:  # a factory: the result's dtype decides where it lives
            kw = dict(kwargs)
            if has_device:
                kw["device"] = META
            out = self.memo.run(func, args, kw)
            made = tensors(out)
            # Integers are real; so are small floats made while recording (Idefics3 buckets patch
            # positions with float aranges). Weights, made while building, are always meta.
            small = self.rec.recording and all(t.numel() * t.element_size() <= _SMALL_FLOAT_BYTES for t in made)
            if has_device and (any(not is_float(t.dtype) for t in made) or small):
                kw["device"] = CPU
                out = func(*args, **kw)
            return out
        on_cpu = [t for t in operands if not t.is_meta]
        if len(on_cpu) == len(operands):
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
        if on_cpu:

            def to_meta(x: Any) -> Any:
                if isinstance(x, torch.Tensor) and not x.is_meta:
                    m = on_meta(x)
                    originals[id(m)] = x
                    return m
                return x

            margs, mkw = map_tensors(to_meta, (args, kwargs))
            meta_operands = tensors((margs, mkw))
        else:  # the common case: nothing to move
            margs, mkw, meta_operands = args, kwargs, operands
        if mkw.get("device") is not None:
            mkw = dict(mkw, device=META)
        out = self.memo.run(func, margs, mkw)
        if not originals and all(is_float(t.dtype) for t in tensors(out)):
            return out  # what settle would return

        def settle(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            for m in meta_operands:  # written in place into a CPU operand: its values stay as they were
                if id(m) in originals and x is m:
                    return originals[id(m)]
            if is_float(x.dtype) or aliases(x, meta_operands):
                return x
            self.rec.oracle[info[1]] += 1
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

    def __init__(self, recorder: Recorder | None = None) -> None:
        self.recorder = recorder or Recorder()
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
    """The request with its floating-point tensors (pixels, audio features) on meta and the others
    (token ids, grids, masks) on the CPU, where the meta model computes with them: a request made for
    a GPU model has them on the GPU."""
    return {k: (torch.empty_like(v, device=META) if is_float(v.dtype) else v.cpu()) for k, v in inputs.items()}


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
        self._recorder = Recorder()
        self._placement: placement | None = None

    def _scan_live_tensors(self) -> list[torch.Tensor]:
        return []  # nothing of a meta run lies in a mapped file

    def __enter__(self) -> MetaCapture:
        if self._active:
            raise RuntimeError("this capture is already running")
        rec = self._recorder
        self._native = rec
        log = MetaLog()
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
        cache = cache_in(output)
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
