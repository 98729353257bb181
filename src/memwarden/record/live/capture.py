"""Live capture of a PyTorch run into a Trace.

Allocation truth: the native recorder (native.cpp) wraps the CPU allocator and
logs every allocate/free with the aten op that made it. Attribution: global
module forward hooks push/pop a context (module path) into the same log; a
root module call is a step (prefill or decode, by its inputs); the KV cache is
found in the outputs of root calls; parameters, buffers, gradients and
optimizer state are found by scanning the modules and optimizers that ran.
Tensors that were alive before the capture started are recorded as
PREEXISTING; tensors whose storage lies in a file-backed mapping (mmap'd
checkpoints) are recorded as MAP, apart from allocator memory.

Usage::

    with memwarden.capture() as cap:
        model.generate(**inputs)
    cap.trace.save("run.mwtrace")
"""

from __future__ import annotations

import gc
import itertools
import os
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from memwarden.record.attribution.attributor import Attributor
from memwarden.record.attribution.log import CaptureLog
from memwarden.record.foreign import registration_hooks, state_dict_hook
from memwarden.record.inputs import (
    DigestCache,
    StepMedia,
    bound_inputs,
    cache_in,
    cache_is_empty,
    cache_tensors,
    fingerprint,
    named_inputs,
    sequence_length,
)
from memwarden.record.live.procmaps import FileMappings
from memwarden.record.live.ring import FlightRecorder
from memwarden.record.live.running import ModuleInfo
from memwarden.record.live.saved import saved_tensors
from memwarden.record.live.sites import CallSites, SiteConfig, apply_call_sites
from memwarden.record.live.step_rule import starts_step
from memwarden.record.live.stream import Streamer
from memwarden.record.modality import ModalityRules
from memwarden.record.python_recorder import recorder
from memwarden.trace.io import save
from memwarden.trace.model import Phase, Trace

# Run as a live capture starts, before it looks for live tensors: memwarden's own caches drop what
# the capture would otherwise count as the process's memory (the estimator's kept meta models hold
# real CPU buffers). Each returns whether it dropped anything.
_BEFORE_START: list[Callable[[], bool]] = []


def before_live_capture(drop: Callable[[], bool]) -> None:
    """Have ``drop`` run as every live capture starts (once per function)."""
    if drop not in _BEFORE_START:
        _BEFORE_START.append(drop)


def _all_subclasses(root: type) -> set[type]:
    found = {root}
    stack = [root]
    while stack:
        subs: list[type] = type.__subclasses__(stack.pop())
        for sub in subs:
            if sub not in found:
                found.add(sub)
                stack.append(sub)
    return found


def _gc_objects(recorder: Any = None) -> list[Any]:
    """Every live tensor and module, from the garbage collector's lists (one pass)."""
    bases = (torch._C.TensorBase, torch.nn.Module)
    walk = getattr(recorder, "gc_instances", None)
    found = walk(bases) if walk is not None else None
    if found is not None:  # walked natively, without a list of every object (native.cpp)
        return list(found)
    # isinstance(o, torch.Tensor) goes through a Python-level metaclass check; over the
    # ~10^5 objects of a transformers process that dominates the scan. Membership of the
    # exact type in the set of all tensor and module classes is a C-speed test instead.
    classes = _all_subclasses(bases[0]) | _all_subclasses(bases[1])
    objects = gc.get_objects()
    return list(itertools.compress(objects, map(classes.__contains__, map(type, objects))))


NUMPY_MIN_BYTES = 4096  # numpy data blocks at least this big are recorded (smaller ones churn, and add little)


class Capture:
    """Context manager recording every allocation of the enclosed PyTorch code."""

    def __init__(
        self,
        *,
        record_ops: bool = True,
        fingerprints: bool = True,
        modality_rules: ModalityRules | None = None,
        metadata: dict[str, Any] | None = None,
        stream_to: str | os.PathLike[str] | None = None,
        lines: bool = True,
        stacks: bool = False,
        user_code: Iterable[str | os.PathLike[str]] | str | None = None,
        library_code: Iterable[str | os.PathLike[str]] | str | None = None,
        ring_s: float | None = None,
        ring_rss_bytes: int | None = None,
    ) -> None:
        # Flight recorder (record/live/ring.py): always streamed, so a death leaves the window.
        self.ring_s, self.ring_rss_bytes = ring_s, ring_rss_bytes
        if ring_s is not None and stream_to is None:
            stream_to = f"memwarden-ring-{os.getpid()}.mwtrace"
        self._ring: FlightRecorder | None = None
        self._fp_base = 0  # input fingerprints the flight recorder dropped from the log's front
        # Source lines: each allocation carries the innermost frame of the user's code (``lines``),
        # or its whole Python stack (``stacks``); ``user_code``/``library_code`` are path prefixes
        # that widen or narrow what counts as the user's code (see record/live/sites.py).
        self.sites = SiteConfig.of(lines=lines, stacks=stacks, user_code=user_code, library_code=library_code)
        # Each step's call site (the user's line that called the model), by the step's start (ns).
        self._callers = CallSites(self.sites) if self.sites.lines else None
        self._call_sites: dict[int, str] = {}
        self.record_ops = record_ops
        # Streamed: the log is appended to this file as the run goes (a killed process leaves it,
        # and memwarden.load recovers it); a clean stop replaces it with the complete trace.
        self.stream_to = stream_to
        self._streamer: Streamer | None = None
        self.fingerprints = fingerprints
        self.rules = modality_rules or ModalityRules()
        self.metadata = dict(metadata or {})
        self.trace: Trace | None = None
        self._native: Any = None
        self._log = CaptureLog()
        self._modules: list[ModuleInfo] = []
        self._module_ids: dict[int, int] = {}
        self._stack: list[int] = []
        self._handles: list[Any] = []
        self._active = False
        self._maps = FileMappings()
        self._own_hooks: set[int] = set()
        self._digests, self._media = DigestCache(), StepMedia()
        self._entries: list[tuple[int, int, bool, bool]] = []  # (ctx, enter index, saw kwargs, is step)
        self._module_handles: list[Any] = []
        self._fast_register: Any = None  # the native recorder's, where it has one (not the meta recorder)

    # -- module registry ---------------------------------------------------------
    def _register_root(self, root: torch.nn.Module) -> None:
        root_label = type(root).__name__
        parent_modality: dict[str, int] = {}
        for path, module in root.named_modules(remove_duplicate=False):
            if id(module) in self._module_ids and self._modules[self._module_ids[id(module)]].ref() is module:
                continue
            modality = int(self.rules.modality_of(path))
            parent = path.rsplit(".", 1)[0] if "." in path else ""
            boundary = path == "" or parent_modality.get(parent, modality) != modality
            parent_modality[path] = modality
            ctx = len(self._modules)
            self._modules.append(
                ModuleInfo(
                    path=path,
                    label=path or root_label,
                    modality=modality,
                    is_boundary=boundary,
                    ref=weakref.ref(module),
                )
            )
            self._module_ids[id(module)] = ctx
            if boundary and self._active:
                self._install_own_hooks(module)
            elif not boundary and self._fast_register is not None:
                self._fast_register(module, ctx)  # its nested calls take the native hooks' fast path
        self._note_parameters(root, self._now())

    def _ctx_of(self, module: torch.nn.Module) -> int:
        ctx = self._module_ids.get(id(module))
        if ctx is None or self._modules[ctx].ref() is not module:
            # A module built during the capture: find the tree it belongs to (once per new model).
            for root in self._roots_alive():
                known = self._module_ids.get(id(root))
                if known is None or self._modules[known].ref() is not root:
                    self._register_root(root)
            ctx = self._module_ids.get(id(module))
            if ctx is None or self._modules[ctx].ref() is not module:
                self._register_root(module)
                ctx = self._module_ids[id(module)]
        return ctx

    def _note_parameters(self, root: torch.nn.Module, t_ns: int) -> None:
        """Record which storages are this module tree's weights, buffers and grads, now.

        Weights mapped from a file (torch.load(mmap=True), safetensors) are recorded here,
        when their model is first seen, so they stay in the trace even if the model is gone
        by the time the capture stops (a local of the script's main())."""
        if self._active:
            self._maps.invalidate()
        for path, module in root.named_modules():
            for _name, p in module.named_parameters(recurse=False):
                self._log.tag(t_ns, p, "weight", path)
                if self._active:
                    self._log.file_backed(t_ns, p, self._maps)
                if p.grad is not None:
                    self._log.tag(t_ns, p.grad, "gradient", path)
            for _name, b in module.named_buffers(recurse=False):
                if b is not None:
                    self._log.tag(t_ns, b, "buffer", path)

    def _now(self) -> int:
        return int(self._native.now_ns())

    # -- hooks ------------------------------------------------------------------
    def _pre_hook(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], has_kwargs: bool = True
    ) -> None:
        ctx = self._ctx_of(module)
        info = self._modules[ctx]
        is_step = not self._stack and starts_step(module, info.path, self._callers)  # record/live/step_rule.py
        fp = None
        if self.fingerprints and info.is_boundary:
            fp = fingerprint((args, kwargs), self._digests)
        if is_step:
            named = bound_inputs(module, args, kwargs)  # model(ids) reads as input_ids=ids
            seq = sequence_length(args, named)
            # A step is a decode step when it feeds one token into a non-empty cache.
            prefill = not (seq == 1 and not cache_is_empty(named))
            phase = Phase.PREFILL if prefill else Phase.DECODE
            self._log.step_start(self._now(), ctx, phase, seq, self._media.step_info(module, named))
            self._log.steps[-1].grad = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            site = self._callers.of_caller() if self._callers is not None else None
            if site is not None:
                self._call_sites[self._log.steps[-1].start_ns] = site
        elif not self._stack:  # a tower run before its decoder's steps (BLIP-2's generate)
            self._media.saw(module, args, kwargs)
        if not self._stack:  # whatever the program feeds into a model from outside is its input
            now = self._now()
            for name, t in named_inputs(module, args, kwargs):  # pixel_values: vision, even from numpy
                self._log.input(now, t, info.path, name)
        self._entries.append((ctx, len(self._log.fingerprints) + self._fp_base, has_kwargs, is_step))
        self._log.enter(ctx, fp)
        self._stack.append(ctx)
        self._native.enter(ctx)

    def _post_hook(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        ctx = self._module_ids.get(id(module))
        if ctx is None:
            return
        self._native.exit(ctx)
        if self._stack and self._stack[-1] == ctx:
            self._stack.pop()
        elif ctx in self._stack:
            del self._stack[self._stack.index(ctx) :]
        else:  # entered on the native fast path (closed out of order), or never seen entering
            return
        entry = None
        while self._entries:
            entry = self._entries.pop()
            if entry[0] == ctx:
                break
        if entry is not None and entry[0] == ctx and not entry[2] and kwargs:
            self._late_kwargs(module, entry, args, kwargs)
        if not self._stack and entry is not None and entry[0] == ctx and entry[3]:
            now = self._now()
            for t in cache_tensors(output):
                self._log.tag(now, t, "kv_cache", "")
            for t in saved_tensors(output):  # what the call's graph keeps for backward
                self._log.saved(now, t)
            self._log.step_end(now)
            if self._streamer is not None:
                self._streamer.boundary("step")

    def _late_kwargs(self, module: torch.nn.Module, entry: tuple[int, int, bool, bool], args: Any, kwargs: Any) -> None:
        """A model first seen inside its own call had its kwargs hooks installed too late for
        that call's pre-hook: fill in what the pre-hook could not see, from the post-hook."""
        ctx, enter_index, _, is_step = entry
        if self.fingerprints and self._modules[ctx].is_boundary and enter_index >= self._fp_base:
            self._log.fingerprints[enter_index - self._fp_base] = fingerprint((args, kwargs), self._digests)
        now = self._now()
        seen = self._log.steps[-1].start_ns if is_step and self._log.steps else now  # before the call: in its peak
        for name, t in named_inputs(module, args, kwargs):
            self._log.input(seen, t, self._modules[ctx].path, name)
        if is_step:
            kwargs = bound_inputs(module, args, kwargs)
            seq = sequence_length(args, kwargs)
            cache = cache_in(kwargs)
            try:  # after the call the cache holds this step's tokens too
                cached = int(cache.get_seq_length()) if cache is not None else 0
            except Exception:
                cached = 0
            decode = seq == 1 and cached > 1
            self._log.fix_step(Phase.DECODE if decode else Phase.PREFILL, seq, self._media.step_info(module, kwargs))

    def _optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._log.optimizer_start(self._now())
        now = self._now()
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._log.tag(now, p.grad, "gradient", "")

    def _optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        now = self._now()
        for state in optimizer.state.values():
            for v in state.values() if isinstance(state, dict) else ():
                if isinstance(v, torch.Tensor) and v.numel() > 1:
                    self._log.tag(now, v, "optimizer_state", "")
        self._log.optimizer_end(now)
        if self._streamer is not None:
            self._streamer.boundary("optimizer")

    # -- preexisting and file-backed tensors ---------------------------------------
    @staticmethod
    def _split(objects: list[Any]) -> tuple[list[torch.Tensor], list[torch.nn.Module]]:
        tensors, modules = [], []
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                modules.append(obj)
            else:
                try:
                    if not obj.is_meta and obj.device.type == "cpu":
                        tensors.append(obj)
                except Exception:  # tensor subclasses without a device
                    continue
        return tensors, modules

    def _scan_live_tensors(self) -> list[torch.Tensor]:
        return self._split(_gc_objects(self._native))[0]

    @staticmethod
    def _roots_of(modules: list[torch.nn.Module]) -> list[torch.nn.Module]:
        children = {id(c) for m in modules for c in m.children()}
        return [m for m in modules if id(m) not in children]

    def _roots_alive(self) -> list[torch.nn.Module]:
        return self._roots_of(self._split(_gc_objects(self._native))[1])

    # -- context manager ---------------------------------------------------------------
    def __enter__(self) -> Capture:
        if self._active:
            raise RuntimeError("this capture is already running")
        self._native = recorder(self.metadata)  # native, else the pure-Python stand-in
        self._fast_register = getattr(self._native, "fast_register", None)
        self._t0 = self._now()
        self._log.clock = self._native.now_ns
        self._wall0 = time.time()
        if any([drop() for drop in _BEFORE_START]):
            gc.collect()  # what was dropped may sit in reference cycles
        tensors, modules = self._split(_gc_objects(self._native))
        for root in self._roots_of(modules):
            self._register_root(root)
        self._maps.invalidate()
        for t in tensors:
            self._log.preexisting(t, self._maps)
        self.sites.apply(self._native)
        self._native.start(self.record_ops)
        numpy_start = getattr(self._native, "numpy_start", None)  # numpy arrays' data, from here on
        self.metadata["numpy_recorded"] = bool(numpy_start is not None and numpy_start(NUMPY_MIN_BYTES))
        self._log.recorded = getattr(self._native, "recorded", None)
        self._active = True
        _ACTIVE.append(self)
        if self.stream_to is not None:
            self._streamer = Streamer(self, self.stream_to)
            self._streamer.start()
        if self.ring_s is not None:
            self._ring = FlightRecorder(self, self.ring_s, self.ring_rss_bytes)
            self._ring.start()
        for info in self._modules:
            module = info.ref()
            if module is not None and info.is_boundary:
                self._install_own_hooks(module)
        pre, post = self._pre_hook_adapter, self._post_hook_adapter
        if self._fast_register is not None:  # nested calls stay in C++; the rest comes back to these
            self._native.set_slow_hooks(pre, post)
            pre, post = self._native.module_pre, self._native.module_post
        self._handles = [
            torch.nn.modules.module.register_module_forward_pre_hook(pre),
            torch.nn.modules.module.register_module_forward_hook(post, always_call=True),
            register_optimizer_step_pre_hook(self._optimizer_pre),
            register_optimizer_step_post_hook(self._optimizer_post),
            *registration_hooks(self._log, self._now),  # foreign (numpy, mmap'd) weights as they are set
            state_dict_hook(self._log, self._now),  # and a mapped state dict copied into a model
        ]
        return self

    # Global module hooks see no keyword arguments, yet transformers calls models
    # with keywords only. Boundary modules (roots, towers, projectors) get their
    # own with_kwargs hooks instead, and the global hooks skip them.
    def _pre_hook_adapter(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if id(module) in self._own_hooks:
            return
        self._pre_hook(module, args, {}, has_kwargs=False)

    def _post_hook_adapter(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if id(module) in self._own_hooks:
            return
        self._post_hook(module, args, None, output)

    def _install_own_hooks(self, module: torch.nn.Module) -> None:
        self._own_hooks.add(id(module))
        self._module_handles.append(module.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
        self._module_handles.append(module.register_forward_hook(self._post_hook, with_kwargs=True, always_call=True))

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop()

    def stop(self) -> Trace:
        if not self._active:
            if self.trace is None:
                raise RuntimeError("capture was never started")
            return self.trace
        self._active = False
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        for h in self._handles + self._module_handles:
            h.remove()
        self._handles, self._module_handles = [], []
        self._own_hooks.clear()
        if self._fast_register is not None:
            self._native.set_slow_hooks(None, None)
            self._native.fast_clear()
        end = self._now()
        for ctx in reversed(self._stack):  # calls cut short by an exception
            self._native.exit(ctx)
        self._stack.clear()
        self._entries.clear()
        for info in self._modules:
            module = info.ref()
            if module is not None and info.path == "":
                self._note_parameters(module, end)
        # File-backed storages: those of the modules that ran (mmap'd checkpoints end up as
        # their parameters). A full gc scan here would cost as much as the one at start.
        self._maps.invalidate()
        for info in self._modules:
            module = info.ref()
            if module is not None and info.path == "":
                for t in itertools.chain(module.parameters(), module.buffers()):
                    self._log.file_backed(end, t, self._maps)
        ring, self._ring = self._ring, None
        if ring is not None:
            ring.close()
            self.metadata["ring"] = ring.stats()
        streamer, self._streamer = self._streamer, None
        if streamer is not None:
            streamer.close()
        self._native.stop()
        numpy_stop = getattr(self._native, "numpy_stop", None)
        if numpy_stop is not None:
            numpy_stop()
        drained = self._native.drain()
        self.metadata.setdefault("capture", "memwarden-native-cpu")
        self.metadata.setdefault("torch_version", torch.__version__)
        self.metadata.setdefault("started_at", self._wall0)
        self.metadata.setdefault("capture_t0_ns", self._t0)  # monotonic ns: places resident samples
        self.metadata.setdefault("device", "cpu")
        attributor = Attributor(
            log=self._log,
            modules=[(m.path, m.label, m.modality) for m in self._modules],
            dtype_names=list(self._native.scalar_type_names()),
            t0_ns=self._t0,
            end_ns=end,
            metadata=self.metadata,
            rules=self.rules,
        )
        self.trace = attributor.build(drained)
        apply_call_sites(self.trace.metadata.get("steps", []), self._call_sites, self._t0)
        if streamer is not None and self.stream_to is not None:
            self.trace.metadata["streamed"] = {"flushes": streamer.flushes, "bytes": streamer.bytes_written}
            save(self.trace, self.stream_to)  # the complete trace replaces the stream, atomically
        return self.trace


_ACTIVE: list[Capture] = []  # running captures, innermost last


def annotate(kind: str, label: str, **details: Any) -> None:
    """Note an event (a governor decision, a budget change) on the running capture's timeline;
    it lands in ``trace.metadata["annotations"]`` and on the report's timeline. No-op without one."""
    for cap in _ACTIVE:
        t_us = max(0, (cap._now() - cap._t0) // 1000)
        cap.metadata.setdefault("annotations", []).append(
            {"time_us": int(t_us), "kind": kind, "label": label, **details}
        )


def ring_stats() -> dict[str, Any] | None:
    """The innermost running capture's flight recorder figures, None without one."""
    for cap in reversed(_ACTIVE):
        if cap._ring is not None:
            return cap._ring.stats()
    return None


__all__ = ["Capture", "annotate", "ring_stats"]
