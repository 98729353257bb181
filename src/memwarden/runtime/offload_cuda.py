"""Weight streaming on a GPU: streamed weights live in pinned host memory and come in through
device staging slots, copied on a side stream ahead of the compute that needs them.

The CUDA counterpart of :class:`memwarden.runtime.offload.WeightStreamer`, with the same
placement, groups, hooks and counters. What differs is where the bytes are and who waits:

- A streamed group's weights are packed into one pinned (page-locked) host buffer, so its copy
  to the device is one DMA transfer that can overlap kernels. Between uses a parameter is a
  one-element NaN placeholder on the device (see ``offload_plan.nan_placeholder``).
- The staging slots are device buffers allocated once, so the caching allocator never sees a
  streamed weight come and go (no ``record_stream`` bookkeeping, no fragmentation).
- A prefetch copies the group predicted to run next into a free slot on a side stream
  (``torch.cuda.Stream``), after waiting on that slot's *released* event (recorded on the compute
  stream when the last group using it finished), and records a *ready* event; the compute stream
  waits on *ready* before the group's first kernel. Neither the host nor the compute stream
  blocks unless the copy is late. A load nothing prefetched runs on the compute stream itself.

Outputs are bit-identical to the resident model: the same bytes reach the same kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from memwarden.plan.placement import Placement
from memwarden.runtime.cuda_reserve import SEGMENT_ROOM_BYTES
from memwarden.runtime.offload_plan import aligned, nan_placeholder, plan_streaming
from memwarden.runtime.streaming import Streamer

__all__ = ["CudaWeightStreamer", "repack_resident", "stream_weights_cuda"]


def stream_weights_cuda(
    model: torch.nn.Module,
    budget_bytes: int,
    *,
    kv_cache_bytes: int = 0,
    activation_bytes: int = 0,
    prefetch: bool = True,
) -> CudaWeightStreamer:
    """``offload.stream_weights`` for a model on a GPU: the same placement, streamed from pinned host
    memory (no files). Raises ``PlacementError`` when the budget cannot hold even two staging slots."""
    placement = plan_streaming(model, budget_bytes, kv_cache_bytes=kv_cache_bytes, activation_bytes=activation_bytes)
    return CudaWeightStreamer(model, placement, prefetch=prefetch)


def repack_resident(model: torch.nn.Module, device: torch.device) -> int:
    """Place the model's tensors on ``device`` afresh, one after another; returns the bytes moved.

    Each tensor that alone owns its whole storage goes to host memory (freeing its device block),
    the allocator's cache goes back to the device, and the tensors come back in order: they fill
    new segments densely instead of holding on to the segments they shared with freed weights.
    Parameters keep their identity (``.data`` is replaced), tied weights and tensors that share a
    storage stay as they are, and so do views (a streamed weight's one-element placeholder). Needs
    the moved bytes in host memory for the moment."""
    params = list(model.parameters())  # each Parameter once, tied ones included once
    slots = [(m, name) for m in model.modules() for name, b in m._buffers.items() if b is not None]
    buffers: list[torch.Tensor] = [m._buffers[name] for m, name in slots]  # type: ignore[misc]
    param_keys = [id(p) for p in params]
    slot_keys = [id(b) for b in buffers]  # a buffer held by two modules: one key
    staged = _to_host({id(t): t for t in [*params, *buffers]}, device)
    del buffers  # nothing here may hold a device block past this point

    def place(new: dict[int, torch.Tensor]) -> None:
        for p, key in zip(params, param_keys, strict=True):
            if key in new:
                p.data = new[key]
        for (m, name), key in zip(slots, slot_keys, strict=True):
            if key in new:
                m._buffers[name] = new[key]

    place(staged)  # the device blocks are freed here (nothing else holds them)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    placed = {key: host.to(device, copy=True) for key, host in staged.items()}
    place(placed)
    return sum(t.nbytes for t in placed.values())


def _to_host(tensors: dict[int, torch.Tensor], device: torch.device) -> dict[int, torch.Tensor]:
    """Host copies of the tensors on ``device`` that alone own their whole, contiguous storage."""
    users: dict[int, set[int]] = {}  # storage -> the tensors (by id) that use it
    for key, t in tensors.items():
        if t.device == device:
            users.setdefault(t.untyped_storage().data_ptr(), set()).add(key)
    staged = {}
    for key, t in tensors.items():
        st = t.untyped_storage()
        if (
            t.device == device
            and t.is_contiguous()
            and t.storage_offset() == 0
            and st.nbytes() == t.nbytes
            and len(users[st.data_ptr()]) == 1
        ):
            staged[key] = t.detach().to("cpu", copy=True)
    return staged


@dataclass
class _HostTensor:
    param: torch.nn.Parameter
    offset: int  # ALIGN_BYTES-aligned, in the group's host buffer and in a slot
    nbytes: int
    placeholder: torch.Tensor


@dataclass
class _HostGroup:
    name: str
    host: torch.Tensor  # pinned uint8: the group's weights, packed
    tensors: list[_HostTensor]
    hooks: list[Any]


@dataclass
class _DeviceSlot:
    buffer: torch.Tensor  # uint8 on the device
    content: int | None = None
    ready: torch.cuda.Event | None = None  # the side-stream copy into it (None: nothing in flight)
    released: torch.cuda.Event | None = None  # the compute stream's last use of it
    in_use: bool = False
    last_used: int = 0


class CudaWeightStreamer(Streamer[_DeviceSlot, _HostGroup]):
    """Streams the groups a :class:`Placement` marks ``streamed`` from pinned host memory to the GPU."""

    def __init__(self, model: torch.nn.Module, placement: Placement, *, prefetch: bool = True) -> None:
        devices = {p.device for p in model.parameters()}
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            raise ValueError(f"CUDA weight streaming needs every parameter on one CUDA device, not {devices}")
        super().__init__(model, placement, prefetch=prefetch)
        self.device = next(iter(devices))
        self.repacked_bytes = 0  # resident tensors placed afresh after the streamed ones left (repack_resident)
        modules, streamable, names = self._streamed()
        torch.cuda.synchronize(self.device)
        self._groups = [self._pack(name, streamable[name]) for name in names]
        self._requires_grad = {id(t.param): t.param.requires_grad for g in self._groups for t in g.tensors}
        for g in self._groups:
            for t in g.tensors:
                t.param.requires_grad_(False)
                t.param.data = t.placeholder  # the device storage is freed here
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()  # and given back to the device, not kept in the allocator's cache
        # Segments the streamed weights shared with resident ones stay reserved, mostly free: place the
        # resident tensors afresh so that those segments empty and go back to the device too.
        if torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device) > SEGMENT_ROOM_BYTES:
            self.repacked_bytes = repack_resident(model, self.device)
        self.slot_bytes = max((int(g.host.numel()) for g in self._groups), default=0)
        self._slots = [self._new_slot() for _ in range(placement.staging_slots)]
        self._copy_stream = torch.cuda.Stream(self.device)
        self._attach(modules)

    def _pack(self, name: str, params: list[tuple[str, torch.nn.Parameter]]) -> _HostGroup:
        sizes = [aligned(p.nbytes) for _, p in params]
        host = torch.empty(sum(sizes), dtype=torch.uint8, pin_memory=True)
        tensors, offset = [], 0
        for (_, p), size in zip(params, sizes, strict=True):
            flat = p.detach().contiguous().reshape(-1).view(torch.uint8)
            host[offset : offset + p.nbytes].copy_(flat)  # device -> pinned host, synchronous
            placeholder = nan_placeholder(p.dtype, tuple(p.shape), self.device)
            tensors.append(_HostTensor(param=p, offset=offset, nbytes=p.nbytes, placeholder=placeholder))
            offset += size
        return _HostGroup(name=name, host=host, tensors=tensors, hooks=[])

    def _new_slot(self) -> _DeviceSlot:
        return _DeviceSlot(torch.empty(self.slot_bytes, dtype=torch.uint8, device=self.device))

    # -- hooks (compute thread) -----------------------------------------------------------

    def _await_prefetch(self, slot: int) -> bool:
        return self._order_after_copy(self._slots[slot])

    def _fill_now(self, index: int, slot: int) -> None:
        state = self._slots[slot]
        self._order_after_copy(state)  # a prefetch still writing a guess into it: let it finish first
        state.content = index
        group = self._groups[index]
        state.buffer[: group.host.numel()].copy_(group.host, non_blocking=True)  # ordered on compute

    def _order_after_copy(self, state: _DeviceSlot) -> bool:
        """Order the compute stream after the copy still writing into ``state``'s slot; whether there was one."""
        if state.ready is None:
            return False
        torch.cuda.current_stream(self.device).wait_event(state.ready)
        state.ready = None
        return True

    def _slot_views(self, slot: int, index: int) -> list[torch.Tensor]:
        buffer = self._slots[slot].buffer
        return [
            buffer[t.offset : t.offset + t.nbytes].view(t.placeholder.dtype).view(t.placeholder.shape)
            for t in self._groups[index].tensors
        ]

    def _released(self, slot: int) -> None:
        released = torch.cuda.Event()
        released.record(torch.cuda.current_stream(self.device))  # kernels reading the slot are queued before
        self._slots[slot].released = released

    def _start_prefetch(self, index: int) -> None:
        free = [s for s, state in enumerate(self._slots) if not state.in_use and state.ready is None]
        if not free:
            return  # never grow the slots for a guess
        slot = min(free, key=lambda s: self._slots[s].last_used)
        state = self._slots[slot]
        state.content = index
        self._touch(slot)
        group = self._groups[index]
        with torch.cuda.stream(self._copy_stream):
            if state.released is not None:
                self._copy_stream.wait_event(state.released)  # its last reader has finished on the GPU
            state.buffer[: group.host.numel()].copy_(group.host, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._copy_stream)
        state.ready = ready
        self._count_load(index)

    def stream_more_within(self, budget_bytes: int, *, kv_cache_bytes: int, activation_bytes: int) -> int:
        """0: a GPU streamer plans once (its pinned buffers and device slots are sized for that plan)."""
        return 0

    @property
    def host_bytes(self) -> int:
        """Pinned host bytes holding the streamed weights."""
        return sum(int(g.host.numel()) for g in self._groups)

    def detach(self, *, delete_files: bool = True) -> None:
        """Bring every streamed weight back to the device as it was, remove the hooks, free the slots
        and the pinned buffers. ``delete_files`` is accepted for ``WeightStreamer``'s signature."""
        if not self._attached:
            return
        torch.cuda.synchronize(self.device)
        for g in self._groups:
            for hook in g.hooks:
                hook.remove()
            for t in g.tensors:
                ph = t.placeholder
                t.param.data = g.host[t.offset : t.offset + t.nbytes].view(ph.dtype).view(ph.shape).to(self.device)
                t.param.requires_grad_(self._requires_grad[id(t.param)])
        torch.cuda.synchronize(self.device)
        self._groups = []
        self._slots.clear()
        self._active.clear()
        self._attached = False
        self.model._memwarden_streamer = None  # type: ignore[assignment]
