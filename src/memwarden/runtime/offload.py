"""Weight streaming: run a transformers model whose weights do not fit its memory budget.

:func:`stream_weights` splits the model into weight groups (each linear, embedding, norm: see
:func:`memwarden.runtime.offload_plan.weight_groups`), asks :func:`memwarden.plan.placement.place` which stay resident, writes
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

- The files are the streamer's own (``offload_files``): without ``offload_dir`` a new private folder
  (0700), removed on ``detach``; each created ``O_EXCL | O_NOFOLLOW`` (a planted symlink is never
  written through), read back only if still the file written and its HMAC (a key in process
  memory) matches, else ``OffloadFileChanged``; only those files are deleted.

A model on a GPU streams with ``memwarden.runtime.offload_cuda`` (pinned host, device slots).
"""

from __future__ import annotations

import os
import secrets
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from memwarden.models.device_profile import MemoryTier
from memwarden.plan.placement import Placement, PlacementError
from memwarden.runtime.offload_files import GroupFile, delete_group, read_group, write_group
from memwarden.runtime.offload_plan import aligned, nan_placeholder, plan_streaming, streamable_params
from memwarden.runtime.private_files import KEY_BYTES
from memwarden.runtime.streaming import Streamer

__all__ = ["WeightStreamer", "stream_weights"]


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
    file: GroupFile
    tensors: list[_Tensor]
    slot_bytes: int
    hooks: list[Any] = field(default_factory=list)


def stream_weights(
    model: torch.nn.Module,
    budget_bytes: int,
    offload_dir: str | os.PathLike[str] | None = None,
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
    ``offload_dir``: where the group files go; none: a new private folder, removed on ``detach``.
    Raises ``PlacementError`` when the budget cannot hold even two staging slots.
    """
    if placement is None:
        placement = plan_streaming(
            model,
            budget_bytes,
            kv_cache_bytes=kv_cache_bytes,
            activation_bytes=activation_bytes,
            tiers=tiers,
            offload_dir=tempfile.gettempdir() if offload_dir is None else offload_dir,
        )
    return WeightStreamer(model, placement, offload_dir, prefetch=prefetch)


class WeightStreamer(Streamer[_Slot, _Group]):
    """Streams the groups a :class:`Placement` marks ``streamed`` from their files through
    ``staging_slots`` slots in host memory."""

    def __init__(
        self,
        model: torch.nn.Module,
        placement: Placement,
        offload_dir: str | os.PathLike[str] | None = None,
        *,
        prefetch: bool = True,
    ) -> None:
        if any(p.device.type != "cpu" for p in model.parameters()):
            raise NotImplementedError("a model on a GPU streams with runtime.offload_cuda.stream_weights_cuda")
        super().__init__(model, placement, prefetch=prefetch)
        modules, streamable, names = self._streamed()

        self._key = secrets.token_bytes(KEY_BYTES)  # in memory only: the files' digests need it
        self._made_dir = offload_dir is None
        if offload_dir is None:
            self.offload_dir = Path(tempfile.mkdtemp(prefix="memwarden-offload-"))  # 0700, ours alone
        else:
            self.offload_dir = Path(offload_dir)
            self.offload_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
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
        self._slots = [self._new_slot() for _ in range(placement.staging_slots)]
        self._views: dict[tuple[int, int], list[torch.Tensor]] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memwarden-prefetch")
        self._attach(modules)

    def _new_slot(self) -> _Slot:
        return _Slot(torch.empty(self.slot_bytes, dtype=torch.uint8))

    def stream_more_within(self, budget_bytes: int, *, kv_cache_bytes: int, activation_bytes: int) -> int:
        """Plan the model again for ``budget_bytes`` (beside ``kv_cache_bytes`` of KV and
        ``activation_bytes`` of activations) and :meth:`stream_more` what that plan streams; 0 where no
        plan fits."""
        try:
            placement = plan_streaming(
                self.model,
                budget_bytes,
                kv_cache_bytes=kv_cache_bytes,
                activation_bytes=activation_bytes,
                offload_dir=self.offload_dir,
            )
        except PlacementError:
            return 0
        return self.stream_more(placement)

    def stream_more(self, placement: Placement) -> int:
        """Also stream the groups a new ``placement`` (a lower budget) marks streamed that are resident
        now, each released as soon as its file is written; returns the bytes released. Groups that fit
        the staging slots go first; then the slots grow for larger ones, and where that allocation is
        refused the slots stay as they were and the larger groups resident. Between forward passes
        only (a session calls it while admitting a request)."""
        for slot in range(len(self._slots)):  # no prefetch may still be writing
            self._wait(slot)
        named = dict(self.model.named_modules())
        modules = {i.name: named[i.name] for i in placement.weights if i.name in named}
        streamable = streamable_params(list(modules.items()))
        have = {g.name for g in self._groups}
        wanted = [i.name for i in placement.weights if i.streamed and i.name not in have and streamable.get(i.name)]
        sizes = {name: sum(aligned(p.nbytes) for _, p in streamable[name]) for name in wanted}
        released = self._add(modules, streamable, [n for n in wanted if sizes[n] <= self.slot_bytes])
        larger = [n for n in wanted if sizes[n] > self.slot_bytes]
        if larger:
            old = self.slot_bytes
            try:
                self._resize_slots(max(sizes[n] for n in larger))
            except (RuntimeError, MemoryError):
                self._resize_slots(old)  # just freed: this fits again
                return released
            released += self._add(modules, streamable, larger)
        return released

    def _add(
        self,
        modules: dict[str, torch.nn.Module],
        streamable: dict[str, list[tuple[str, torch.nn.Parameter]]],
        names: list[str],
    ) -> int:
        released = 0
        for name in names:
            group = self._write(name, streamable[name])
            index = len(self._groups)
            self._groups.append(group)
            for t in group.tensors:
                self._requires_grad[id(t.param)] = t.param.requires_grad
                t.param.requires_grad_(False)
                t.param.data = t.placeholder
                released += t.nbytes
            self._hook(index, modules[name])
        return released

    def _resize_slots(self, nbytes: int) -> None:
        """Staging slots of ``nbytes`` each; the old ones are freed first (they only cache copies)."""
        self._views.clear()
        for slot in self._slots:
            slot.buffer, slot.content = torch.empty(0, dtype=torch.uint8), None
        for slot in self._slots:
            slot.buffer = torch.empty(nbytes, dtype=torch.uint8)
        self.slot_bytes = nbytes

    def _write(self, name: str, params: list[tuple[str, torch.nn.Parameter]]) -> _Group:
        by_key = {key: p for key, p in params}
        file = write_group(self.offload_dir, name or "model", {key: p.detach() for key, p in params}, self._key)
        tensors = []
        slot_offset = 0
        # Slot order = file order, so that copies read the file front to back.
        for key, (begin, end) in file.extents.items():
            p = by_key[key]
            placeholder = nan_placeholder(p.dtype, tuple(p.shape))
            tensors.append(_Tensor(p, key, begin, end - begin, slot_offset, placeholder))
            slot_offset += aligned(end - begin)
        return _Group(name=name, file=file, tensors=tensors, slot_bytes=slot_offset)

    def _await_prefetch(self, slot: int) -> bool:
        if self._slots[slot].pending is None:
            return False
        self._wait(slot)
        return True

    def _fill_now(self, index: int, slot: int) -> None:
        self._wait(slot)
        self._slots[slot].content = index
        try:
            self._copy(index, slot)
        except BaseException:
            self._slots[slot].content = None  # holds bytes nothing may use (a refused or partial copy)
            raise

    def _start_prefetch(self, index: int) -> None:
        slot = self._least_recently_used_free()
        if slot is None:
            return  # never grow the slots for a guess
        self._wait(slot)
        try:
            future = self._executor.submit(self._copy, index, slot)
        except RuntimeError:  # no thread could start (a real address-space limit has no room for its stack)
            self.prefetch = False  # copies go on, on the compute thread
            return
        self._slots[slot].content, self._slots[slot].pending = index, future
        self._touch(slot)
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
        address = self._slots[slot].buffer.data_ptr()
        targets = [(address + t.slot_offset, t.file_offset, t.nbytes) for t in group.tensors]
        read_group(group.file, self._key, targets, repr(group.name or "the model"))

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

    def detach(self, *, delete_files: bool = True) -> None:
        """Bring every streamed weight back into memory (as it was before streaming), remove the
        hooks and the staging slots, close the mappings; delete the files unless told not to."""
        if not self._attached:
            return
        for slot in range(len(self._slots)):  # no copy may still write into a slot
            self._wait(slot)
        self._read_back()  # first: if memory runs out, the model is left streaming, hooks and all
        self._executor.shutdown(wait=True)
        for g in self._groups:
            for hook in g.hooks:
                hook.remove()
        self._views.clear()
        self._slots.clear()
        self._active.clear()
        self._close_files(delete=delete_files)
        self._attached = False
        self.model._memwarden_streamer = None  # type: ignore[assignment]

    def _read_back(self) -> None:
        """Every released weight back into memory from its file, as it was before streaming. All are
        read before any is put back: where memory runs out part-way (a real limit below the weights)
        nothing changes and the allocator's error is raised — the model goes on streaming."""
        back: list[tuple[_Tensor, torch.Tensor]] = []
        for g in self._groups:
            if not any(id(t.param) in self._requires_grad for t in g.tensors):
                continue
            read = [torch.empty(t.placeholder.shape, dtype=t.placeholder.dtype) for t in g.tensors]
            targets = [(data.data_ptr(), t.file_offset, t.nbytes) for t, data in zip(g.tensors, read, strict=True)]
            read_group(g.file, self._key, targets, repr(g.name or "the model"))
            back.extend(
                (t, data) for t, data in zip(g.tensors, read, strict=True) if id(t.param) in self._requires_grad
            )
        for t, data in back:
            t.param.data = data
            t.param.requires_grad_(self._requires_grad.pop(id(t.param)))

    def _close_files(self, *, delete: bool) -> None:
        """Delete the files this streamer created (the same inode still at the name: never a file put
        in its place), then the private folder it made, if empty."""
        if not delete:
            return
        for g in self._groups:
            delete_group(g.file)
        if self._made_dir:
            try:
                os.rmdir(self.offload_dir)
            except OSError:
                pass
