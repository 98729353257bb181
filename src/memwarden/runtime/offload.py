"""Weight streaming: run a transformers model whose weights do not fit its memory budget.

:func:`stream_weights` splits the model into weight groups (each linear, embedding, norm: see
:func:`weight_groups`), asks :func:`memwarden.plan.placement.place` which stay resident, writes
the others to one safetensors file per group in ``offload_dir``, releasing each group's memory
as soon as its file is written. A streamed group's forward pre-hook reads it from its file into one
of two staging slots
(unless a prefetch already did) and makes its parameters views of that slot, then starts
copying the group predicted to run next into the other slot on a background thread; its
forward hook releases the parameters. Streamed weights thus never hold more than two slots of
allocated memory. Outputs are bit-identical: the same bytes, 64-byte aligned like a fresh
tensor, go through the same kernels.

Why the details are what they are:

- Between uses a streamed parameter is a NaN placeholder of its shape and dtype with a 1-element
  storage, not a view of the mapping: PyTorch's memory profiler records the parameters of every
  module call and counts each storage it sees, so mapped views would count in full; and code
  that reads a weight outside its module's forward gets NaNs, which tests catch, rather than
  silently working.
- Copies are ``os.preadv`` straight into the slot, not torch ops and not a memory map: they release
  the GIL (the prefetch overlaps compute), the profiler never sees a source tensor, and the file's
  pages stay in the page cache (reclaimable) instead of the resident set or the address space —
  a mapping of every streamed group cost as much address space as the weights it replaced, which
  an ``RLIMIT_AS`` (or a 32-bit board) refuses exactly when streaming is needed.
- Each group's original storage is released once its file is written, so streaming never holds
  more than the weights plus one group; a failure part-way reads the released groups back.
- The next group is learned from what ran after each group last time (a decode step runs the
  text layers but not the vision tower), starting from registration order.
- Streamed parameters get ``requires_grad=False``: a backward pass would read slots that later
  groups have overwritten. Streaming is for inference; :meth:`WeightStreamer.detach` restores all.
- Groups are single modules, not decoder layers: small slots leave more budget to resident
  weights, and each copy is read back while it is likely still cached (bench_offload.py compares).

A model on a GPU streams with ``memwarden.runtime.offload_cuda`` (pinned host, device slots).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from memwarden.capture.modality import ModalityRules
from memwarden.models.devices import MemoryTier
from memwarden.plan.placement import Placement, WeightGroup, place
from memwarden.trace.model import Modality

__all__ = ["StreamStats", "WeightStreamer", "default_tiers", "plan_streaming", "stream_weights", "weight_groups"]

ALIGN_BYTES = 64  # what PyTorch's CPU allocator gives a fresh tensor; kernels see the same alignment
# Modules whose weights their parent's forward reads directly, never calling them, so no hook of
# theirs can bring the weights in: Whisper-style audio encoders (Qwen2-Audio, Whisper) read
# `embed_positions.weight`. They stay resident. Others show up as NaN outputs (see _placeholder).
READ_BY_PARENT = ("embed_positions",)
_ONCE_PER_REQUEST = (Modality.VISION, Modality.AUDIO, Modality.FUSION)  # encoders and projectors


@dataclass
class StreamStats:
    """What the streamer did; counters since :func:`stream_weights` (or :meth:`reset`)."""

    loads: int = 0  # groups copied into a slot
    sync_loads: int = 0  # ... on the compute thread, because nothing had prefetched them
    prefetch_hits: int = 0  # group found in a slot a prefetch had filled
    reuses: int = 0  # group still in its slot from its previous use: no copy at all
    copied_bytes: int = 0
    wait_s: float = 0.0  # time the compute thread spent waiting for copies
    extra_slots: int = 0  # slots added because streamed groups nested deeper than the slots

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


@dataclass
class _Tensor:
    param: torch.nn.Parameter
    key: str  # name in the group's safetensors file
    file_offset: int  # from the start of the file
    nbytes: int
    slot_offset: int  # ALIGN_BYTES-aligned offset in a staging slot
    placeholder: torch.Tensor  # what the parameter is between uses; has its shape and dtype


@dataclass
class _Slot:
    buffer: torch.Tensor  # uint8, the largest streamed group's bytes
    content: int | None = None  # index of the group it holds or is receiving
    pending: Future[None] | None = None  # the prefetch copying into it
    in_use: bool = False  # a running group's parameters are views of it
    last_used: int = 0


@dataclass
class _Group:
    name: str
    path: Path
    tensors: list[_Tensor]
    slot_bytes: int
    hooks: list[Any] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Groups and plans


def weight_groups(model: torch.nn.Module, *, split_layers: bool = False) -> list[tuple[str, torch.nn.Module]]:
    """The model's weight groups in registration order: disjoint module subtrees that cover every
    parameter and buffer. A group is a module with tensors of its own (a linear, an embedding, a
    norm) or a leaf; with ``split_layers=False`` an element of a ModuleList/ModuleDict (a whole
    decoder layer) is one group."""
    out: list[tuple[str, torch.nn.Module]] = []

    def visit(prefix: str, module: torch.nn.Module, is_layer: bool) -> None:
        own = any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False))
        children = list(module.named_children())
        if (is_layer and not split_layers) or own or not children:
            if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
                out.append((prefix, module))
            return
        container = isinstance(module, torch.nn.ModuleList | torch.nn.ModuleDict)
        for name, child in children:
            visit(f"{prefix}.{name}" if prefix else name, child, container)

    visit("", model, False)
    return out


def _streamable(groups: list[tuple[str, torch.nn.Module]]) -> dict[str, list[tuple[str, torch.nn.Parameter]]]:
    """Per group, the parameters it may stream: those no other group uses (a tied parameter is
    in two groups) of a module no parent reads directly (READ_BY_PARENT). The rest stay resident."""
    uses = Counter(id(p) for _, module in groups for p in module.parameters())  # each module lists a tensor once
    return {
        name: [(k, p) for k, p in module.named_parameters() if uses[id(p)] == 1]
        if name.rsplit(".", 1)[-1] not in READ_BY_PARENT
        else []
        for name, module in groups
    }


def _specs(model: torch.nn.Module, split_layers: bool) -> list[WeightGroup]:
    rules = ModalityRules()
    groups = weight_groups(model, split_layers=split_layers)
    streamable = _streamable(groups)
    counted: set[int] = set()  # tied tensors are pinned in every group that uses them; count them once
    specs = []
    for order, (name, module) in enumerate(groups):
        streamable_ids = {id(p) for _, p in streamable[name]}
        pinned_bytes = 0
        for t in list(module.parameters()) + list(module.buffers()):
            if id(t) not in streamable_ids and id(t) not in counted:
                counted.add(id(t))
                pinned_bytes += t.nbytes
        specs.append(
            WeightGroup(
                name=name,
                weight_bytes=sum(_aligned(p.nbytes) for _, p in streamable[name]),  # as laid out in a slot
                order=order,
                per_token=rules.modality_of(name) not in _ONCE_PER_REQUEST,
                pinned_bytes=pinned_bytes,
            )
        )
    return specs


def default_tiers(offload_dir: str | os.PathLike[str]) -> tuple[MemoryTier, ...]:
    """This machine as a CPU-only device: host memory and the disk holding ``offload_dir``.
    Bandwidths are rough assumptions (dual-channel DDR, NVMe) that only feed
    ``predicted_stream_us_per_token``; pass a device profile's tiers to plan for real hardware."""
    path = Path(offload_dir)
    while not path.exists():
        path = path.parent
    return (
        MemoryTier(name="host", capacity_bytes=psutil.virtual_memory().total, bandwidth_gbps=20.0, latency_us=0.1),
        MemoryTier(name="disk", capacity_bytes=shutil.disk_usage(path).free, bandwidth_gbps=2.0, latency_us=100.0),
    )


def plan_streaming(
    model: torch.nn.Module,
    budget_bytes: int,
    *,
    kv_cache_bytes: int = 0,
    activation_bytes: int = 0,
    tiers: tuple[MemoryTier, ...] | None = None,
    offload_dir: str | os.PathLike[str] = ".",
    split_layers: bool = True,
) -> Placement:
    """The placement :func:`stream_weights` would carry out; changes nothing. ``split_layers``:
    see :func:`weight_groups`."""
    return place(
        _specs(model, split_layers),
        budget_bytes=budget_bytes,
        tiers=tiers or default_tiers(offload_dir),
        kv_cache_bytes=kv_cache_bytes,
        activation_bytes=activation_bytes,
    )


def stream_weights(
    model: torch.nn.Module,
    budget_bytes: int,
    offload_dir: str | os.PathLike[str],
    *,
    kv_cache_bytes: int = 0,
    activation_bytes: int = 0,
    tiers: tuple[MemoryTier, ...] | None = None,
    placement: Placement | None = None,
    prefetch: bool = True,
) -> WeightStreamer:
    """Stream ``model``'s weights so that weights + ``kv_cache_bytes`` + ``activation_bytes`` stay
    under ``budget_bytes``. Returns the :class:`WeightStreamer` (a context manager); the model is
    used as before (``model(...)``, ``model.generate(...)``) until ``detach()``. A model on a GPU:
    :func:`memwarden.runtime.offload_cuda.stream_weights_cuda`.

    ``placement`` overrides the plan (e.g. one from :func:`plan_streaming` with other tiers).
    Raises ``PlacementError`` when the budget cannot hold even two staging slots.
    """
    if placement is None:
        placement = plan_streaming(
            model,
            budget_bytes,
            kv_cache_bytes=kv_cache_bytes,
            activation_bytes=activation_bytes,
            tiers=tiers,
            offload_dir=offload_dir,
        )
    return WeightStreamer(model, placement, offload_dir, prefetch=prefetch)


class WeightStreamer:
    """Streams the groups a :class:`Placement` marks ``streamed`` through ``staging_slots`` slots."""

    def __init__(
        self,
        model: torch.nn.Module,
        placement: Placement,
        offload_dir: str | os.PathLike[str],
        *,
        prefetch: bool = True,
    ) -> None:
        if any(p.device.type != "cpu" for p in model.parameters()):
            raise NotImplementedError("a model on a GPU streams with runtime.offload_cuda.stream_weights_cuda")
        if getattr(model, "_memwarden_streamer", None) is not None:  # its weights are placeholders now
            raise ValueError("this model's weights are already streamed; detach() that streamer first")
        self.model = model
        self.placement = placement
        self.prefetch = prefetch
        self.stats = StreamStats()
        self.offload_dir = Path(offload_dir)
        self.offload_dir.mkdir(parents=True, exist_ok=True)
        named = dict(model.named_modules())
        unknown = [i.name for i in placement.weights if i.name not in named]
        if unknown:
            raise ValueError(f"placement names modules the model does not have: {', '.join(unknown[:5])}")
        modules = {i.name: named[i.name] for i in placement.weights}
        streamable = _streamable(list(modules.items()))
        names = [i.name for i in placement.weights if i.streamed and i.nbytes > 0 and streamable[i.name]]

        self._groups: list[_Group] = []
        self._requires_grad: dict[int, bool] = {}
        try:
            for name in names:
                group = self._write(name, streamable[name])
                self._groups.append(group)
                for t in group.tensors:  # released now: the next group's write needs the room
                    self._requires_grad[id(t.param)] = t.param.requires_grad
                    t.param.requires_grad_(False)
                    t.param.data = t.placeholder
        except BaseException:
            self._read_back()
            self._close_files(delete=True)
            raise

        self.slot_bytes = max((g.slot_bytes for g in self._groups), default=0)
        self._slots = [_Slot(torch.empty(self.slot_bytes, dtype=torch.uint8)) for _ in range(placement.staging_slots)]
        self._tick = 0
        self._views: dict[tuple[int, int], list[torch.Tensor]] = {}
        self._active: dict[int, list[int]] = {}  # group -> [slot, nesting depth]
        self._last_group: int | None = None
        # Until a group has been seen to run, guess that the next streamed group in registration order follows it.
        self._next: dict[int, int] = {i: i + 1 for i in range(len(self._groups) - 1)}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memwarden-prefetch")
        for i, g in enumerate(self._groups):
            module = modules[g.name]
            g.hooks.append(module.register_forward_pre_hook(partial(self._pre_hook, i)))
            g.hooks.append(module.register_forward_hook(partial(self._post_hook, i), always_call=True))
        self._attached = True
        model._memwarden_streamer = self  # type: ignore[assignment]

    def _write(self, name: str, params: list[tuple[str, torch.nn.Parameter]]) -> _Group:
        path = self.offload_dir / f"{name or 'model'}.safetensors"
        by_key = {key: p for key, p in params}
        save_file({key: p.detach().contiguous() for key, p in params}, str(path), metadata={"memwarden": "offload"})
        with path.open("rb") as f:
            (header_bytes,) = struct.unpack("<Q", f.read(8))  # safetensors: u64 LE header length, JSON header, data
            header = json.loads(f.read(header_bytes))
        data_start = 8 + header_bytes
        tensors = []
        slot_offset = 0
        # Slot order = file order, so that copies read the file front to back.
        entries = [(info["data_offsets"], key) for key, info in header.items() if key != "__metadata__"]
        for (begin, end), key in sorted(entries):
            p = by_key[key]
            tensors.append(
                _Tensor(
                    param=p,
                    key=key,
                    file_offset=data_start + begin,
                    nbytes=end - begin,
                    slot_offset=slot_offset,
                    placeholder=_placeholder(p.dtype, tuple(p.shape)),
                )
            )
            slot_offset += _aligned(end - begin)
        return _Group(name=name, path=path, tensors=tensors, slot_bytes=slot_offset)

    def _pre_hook(self, index: int, module: torch.nn.Module, args: Any) -> None:
        if index in self._active:  # a group re-entered from inside itself
            self._active[index][1] += 1
            return
        if self._last_group is not None and self._last_group != index:
            self._next[self._last_group] = index
        slot = self._slot_holding(index)
        if slot is not None:
            future = self._slots[slot].pending
            if future is not None:
                self._wait(slot)
                self.stats.prefetch_hits += 1
            else:
                self.stats.reuses += 1
        else:
            slot = self._free_slot()
            self._wait(slot)
            self._slots[slot].content = index
            self._copy(index, slot)
            self._count_load(index)
            self.stats.sync_loads += 1
        self._slots[slot].in_use = True
        self._touch(slot)
        for t, view in zip(self._groups[index].tensors, self._slot_views(slot, index), strict=True):
            t.param.data = view
        self._active[index] = [slot, 1]
        if self.prefetch:
            self._start_prefetch(self._next.get(index))

    def _post_hook(self, index: int, module: torch.nn.Module, args: Any, output: Any) -> None:
        state = self._active.get(index)
        if state is None:
            return
        state[1] -= 1
        if state[1] > 0:
            return
        del self._active[index]
        for t in self._groups[index].tensors:
            t.param.data = t.placeholder
        self._slots[state[0]].in_use = False
        self._last_group = index

    def _slot_holding(self, index: int) -> int | None:
        return next((slot for slot, state in enumerate(self._slots) if state.content == index), None)

    def _least_recently_used_free(self) -> int | None:
        free = [slot for slot, state in enumerate(self._slots) if not state.in_use]
        return min(free, key=lambda slot: self._slots[slot].last_used) if free else None

    def _touch(self, slot: int) -> None:
        self._tick += 1
        self._slots[slot].last_used = self._tick

    def _free_slot(self) -> int:
        """The least recently used slot no running group is using; a new one if all are in use."""
        slot = self._least_recently_used_free()
        if slot is None:
            self._slots.append(_Slot(torch.empty(self.slot_bytes, dtype=torch.uint8)))
            self.stats.extra_slots += 1
            slot = len(self._slots) - 1
        return slot

    def _start_prefetch(self, index: int | None) -> None:
        if index is None or index in self._active or self._slot_holding(index) is not None:
            return
        slot = self._least_recently_used_free()
        if slot is None:
            return  # never grow the slots for a guess
        self._wait(slot)
        self._slots[slot].content = index
        self._touch(slot)
        self._slots[slot].pending = self._executor.submit(self._copy, index, slot)
        self._count_load(index)

    def _wait(self, slot: int) -> None:
        future = self._slots[slot].pending
        if future is None:
            return
        start = time.perf_counter()
        try:
            future.result()
        except BaseException:
            self._slots[slot].content = None  # a failed copy leaves the slot holding nothing
            raise
        finally:
            self._slots[slot].pending = None
            self.stats.wait_s += time.perf_counter() - start

    def _copy(self, index: int, slot: int) -> None:
        """Read group ``index`` from its file into ``slot`` (runs on the prefetch thread too)."""
        group = self._groups[index]
        slot_address = self._slots[slot].buffer.data_ptr()
        fd = os.open(group.path, os.O_RDONLY)
        try:
            for t in group.tensors:
                _read_exactly(fd, slot_address + t.slot_offset, t.file_offset, t.nbytes, group.path)
        finally:
            os.close(fd)

    def _count_load(self, index: int) -> None:
        # Counted on the compute thread only, so the counters need no lock.
        self.stats.loads += 1
        self.stats.copied_bytes += sum(t.nbytes for t in self._groups[index].tensors)

    def _slot_views(self, slot: int, index: int) -> list[torch.Tensor]:
        key = (slot, index)
        views = self._views.get(key)
        if views is None:
            buffer = self._slots[slot].buffer
            views = [
                buffer[t.slot_offset : t.slot_offset + t.nbytes].view(t.placeholder.dtype).view(t.placeholder.shape)
                for t in self._groups[index].tensors
            ]
            self._views[key] = views
        return views

    @property
    def staging_bytes(self) -> int:
        """Allocated bytes the streamed weights hold: the staging slots."""
        return self.slot_bytes * len(self._slots)

    def detach(self, *, delete_files: bool = True) -> None:
        """Bring every streamed weight back into memory (as it was before streaming), remove the
        hooks and the staging slots, close the mappings; delete the files unless told not to."""
        if not getattr(self, "_attached", False):
            return
        for slot in range(len(self._slots)):  # no copy may still write into a slot
            self._wait(slot)
        self._executor.shutdown(wait=True)
        for g in self._groups:
            for hook in g.hooks:
                hook.remove()
        self._read_back()
        self._views.clear()
        self._slots.clear()
        self._active.clear()
        self._close_files(delete=delete_files)
        self._attached = False
        self.model._memwarden_streamer = None  # type: ignore[assignment]

    def _read_back(self) -> None:
        """Every released weight back into memory from its file, as it was before streaming."""
        for g in self._groups:
            with safe_open(str(g.path), framework="pt") as f:
                for t in g.tensors:
                    if id(t.param) in self._requires_grad:
                        t.param.data = f.get_tensor(t.key)
                        t.param.requires_grad_(self._requires_grad.pop(id(t.param)))

    def _close_files(self, *, delete: bool) -> None:
        if delete:
            for g in self._groups:
                g.path.unlink(missing_ok=True)

    def __enter__(self) -> WeightStreamer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.detach()


def _read_exactly(fd: int, address: int, offset: int, nbytes: int, path: Path) -> None:
    """``nbytes`` of ``fd`` from ``offset`` into memory at ``address`` (``os.preadv`` releases the GIL)."""
    done = 0
    while done < nbytes:
        view = (ctypes.c_char * (nbytes - done)).from_address(address + done)
        n = os.preadv(fd, [view], offset + done)
        if n <= 0:
            raise OSError(f"{path}: the offload file ends early ({done} of {nbytes} bytes at offset {offset})")
        done += n


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES


def _placeholder(dtype: torch.dtype, shape: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` with one element of storage on ``device``: NaN for floats, so
    that a weight read outside its module's forward poisons the output instead of passing unnoticed.
    (Made on the device, never moved there: ``.to()`` would materialize the expanded shape.)"""
    fill = float("nan") if dtype.is_floating_point or dtype.is_complex else 0
    return torch.full((), fill, dtype=dtype, device=device).expand(shape)
