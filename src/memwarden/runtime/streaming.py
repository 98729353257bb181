"""What every weight streamer is, whichever memory its streamed weights wait in.

:class:`memwarden.runtime.offload.WeightStreamer` (files, host staging slots) and
:class:`memwarden.runtime.offload_cuda.CudaWeightStreamer` (pinned host memory, device slots) carry
out the same :class:`Placement` the same way: one forward pre-hook and one forward hook per streamed
group, slots reused least recently used first, the next group learned from what ran after it last
time, the same counters. That bookkeeping lives here, once; a subclass says where a group's bytes
come from and how a copy is waited for.

A session holds either as a :class:`Streamer` and asks it (``staging_bytes``, ``stream_more_within``)
instead of branching on which one it is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

import torch

from memwarden.plan.placement import Placement
from memwarden.runtime.offload_plan import streamable_params

__all__ = ["StreamStats", "Streamer"]


@dataclass
class StreamStats:
    """What the streamer did; counters since it started streaming (or :meth:`reset`)."""

    loads: int = 0  # groups copied into a slot
    sync_loads: int = 0  # ... on the compute thread, because nothing had prefetched them
    prefetch_hits: int = 0  # group found in a slot a prefetch had filled
    reuses: int = 0  # group still in its slot from its previous use: no copy at all
    copied_bytes: int = 0
    wait_s: float = 0.0  # time the compute thread spent waiting for copies
    extra_slots: int = 0  # slots added because streamed groups nested deeper than the slots

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


class _SlotState(Protocol):
    content: int | None  # index of the group it holds or is receiving
    in_use: bool  # a running group's parameters are views of it
    last_used: int


class _StreamedTensor(Protocol):
    @property
    def param(self) -> torch.nn.Parameter: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def placeholder(self) -> torch.Tensor: ...  # what the parameter is between uses


class _StreamedGroup(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def tensors(self) -> Sequence[_StreamedTensor]: ...
    @property
    def hooks(self) -> list[Any]: ...


SlotT = TypeVar("SlotT", bound=_SlotState)
GroupT = TypeVar("GroupT", bound=_StreamedGroup)
_Self = TypeVar("_Self", bound="Streamer[Any, Any]")


class Streamer(ABC, Generic[SlotT, GroupT]):
    """Streams the groups a :class:`Placement` marks ``streamed`` through ``staging_slots`` slots.

    A subclass builds its groups and slots between :meth:`__init__` and :meth:`_attach`, and gives
    the hooks' copies (``_fill_now``, ``_await_prefetch``, ``_start_prefetch``), a slot's views
    (``_slot_views``), a new slot (``_new_slot``) and the way back (``detach``)."""

    def __init__(self, model: torch.nn.Module, placement: Placement, *, prefetch: bool) -> None:
        if getattr(model, "_memwarden_streamer", None) is not None:  # its weights are placeholders now
            raise ValueError("this model's weights are already streamed; detach() that streamer first")
        self.model = model
        self.placement = placement
        self.prefetch = prefetch
        self.stats = StreamStats()
        self.slot_bytes = 0  # each staging slot's bytes: the largest streamed group, 64-byte aligned
        self._groups: list[GroupT] = []
        self._slots: list[SlotT] = []
        self._tick = 0
        self._active: dict[int, list[int]] = {}  # group -> [slot, nesting depth]
        self._last_group: int | None = None
        self._next: dict[int, int] = {}  # group -> the group seen to run after it
        self._attached = False

    def _streamed(
        self,
    ) -> tuple[dict[str, torch.nn.Module], dict[str, list[tuple[str, torch.nn.Parameter]]], list[str]]:
        """The placement's modules by name, their streamable parameters, and the names of the groups
        to stream (streamed, non-empty, with a parameter to stream), in the placement's order."""
        named = dict(self.model.named_modules())
        unknown = [i.name for i in self.placement.weights if i.name not in named]
        if unknown:
            raise ValueError(f"placement names modules the model does not have: {', '.join(unknown[:5])}")
        modules = {i.name: named[i.name] for i in self.placement.weights}
        streamable = streamable_params(list(modules.items()))
        names = [i.name for i in self.placement.weights if i.streamed and i.nbytes > 0 and streamable[i.name]]
        return modules, streamable, names

    def _attach(self, modules: dict[str, torch.nn.Module]) -> None:
        """Hook every group into its module and mark the model as streamed."""
        # Until a group has been seen to run, guess that the next streamed group in registration order follows it.
        self._next = {i: i + 1 for i in range(len(self._groups) - 1)}
        for i, g in enumerate(self._groups):
            self._hook(i, modules[g.name])
        self._attached = True
        self.model._memwarden_streamer = self  # type: ignore[assignment]

    def _hook(self, index: int, module: torch.nn.Module) -> None:
        group = self._groups[index]
        group.hooks.append(module.register_forward_pre_hook(partial(self._pre_hook, index)))
        group.hooks.append(module.register_forward_hook(partial(self._post_hook, index), always_call=True))

    # -- hooks (compute thread) -----------------------------------------------------------

    def _pre_hook(self, index: int, module: torch.nn.Module, args: Any) -> None:
        """Make group ``index``'s parameters views of a slot holding its bytes: the slot that has
        them (a prefetch's copy waited for, or still there from the group's last use), else the least
        recently used free slot, filled now on the compute thread; then prefetch the group expected next."""
        if self._reentered(index):
            return
        slot = self._slot_holding(index)
        if slot is None:
            slot = self._free_slot()
            self._fill_now(index, slot)
            self._count_load(index)
            self.stats.sync_loads += 1
        elif self._await_prefetch(slot):
            self.stats.prefetch_hits += 1
        else:
            self.stats.reuses += 1
        self._slots[slot].in_use = True
        self._touch(slot)
        for t, view in zip(self._groups[index].tensors, self._slot_views(slot, index), strict=True):
            t.param.data = view
        self._active[index] = [slot, 1]
        following = self._next.get(index)
        if (
            self.prefetch
            and following is not None
            and following not in self._active
            and self._slot_holding(following) is None
        ):
            self._start_prefetch(following)

    @abstractmethod
    def _await_prefetch(self, slot: int) -> bool:
        """Wait (on the compute thread or stream) for a prefetch still copying into ``slot``; whether
        there was one. ``slot`` holds the group that is about to run."""

    @abstractmethod
    def _fill_now(self, index: int, slot: int) -> None:
        """Copy group ``index`` into ``slot`` now, for the compute thread (after whatever was still
        being copied into the slot); ``slot`` holds the group from then on."""

    @abstractmethod
    def _slot_views(self, slot: int, index: int) -> list[torch.Tensor]:
        """Group ``index``'s tensors as views of ``slot``'s bytes, in the group's order."""

    @abstractmethod
    def _start_prefetch(self, index: int) -> None:
        """Start copying group ``index`` (in no slot, not running) into a free slot, off the compute
        thread; nothing where no slot is free (a guess never adds a slot)."""

    def _reentered(self, index: int) -> bool:
        """Whether group ``index`` is running already (re-entered from inside itself: its weights are
        in place); if not, learn that it follows the group that ran last."""
        if index in self._active:
            self._active[index][1] += 1
            return True
        if self._last_group is not None and self._last_group != index:
            self._next[self._last_group] = index
        return False

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
        self._released(state[0])
        self._last_group = index

    def _released(self, slot: int) -> None:
        """``slot``'s group has finished on the compute thread (a GPU's kernels may still read it)."""

    # -- slots ----------------------------------------------------------------------------

    @abstractmethod
    def _new_slot(self) -> SlotT:
        """An empty staging slot of ``slot_bytes``."""

    def _slot_holding(self, index: int) -> int | None:
        return next((slot for slot, state in enumerate(self._slots) if state.content == index), None)

    def _least_recently_used_free(self) -> int | None:
        free = [slot for slot, state in enumerate(self._slots) if not state.in_use]
        return min(free, key=lambda slot: self._slots[slot].last_used) if free else None

    def _free_slot(self) -> int:
        """The least recently used slot no running group is using; a new one if all are in use."""
        slot = self._least_recently_used_free()
        if slot is None:
            self._slots.append(self._new_slot())
            self.stats.extra_slots += 1
            slot = len(self._slots) - 1
        return slot

    def _touch(self, slot: int) -> None:
        self._tick += 1
        self._slots[slot].last_used = self._tick

    def _count_load(self, index: int) -> None:
        # Counted on the compute thread only, so the counters need no lock.
        self.stats.loads += 1
        self.stats.copied_bytes += sum(t.nbytes for t in self._groups[index].tensors)

    @property
    def staging_bytes(self) -> int:
        """Bytes the streamed weights hold where the model runs: the staging slots."""
        return self.slot_bytes * len(self._slots)

    # -- what a session asks --------------------------------------------------------------

    @abstractmethod
    def stream_more_within(self, budget_bytes: int, *, kv_cache_bytes: int, activation_bytes: int) -> int:
        """Stream more groups so that weights + ``kv_cache_bytes`` + ``activation_bytes`` come closer
        to ``budget_bytes``; the bytes released (0: nothing more could stream). Between forward passes."""

    @abstractmethod
    def detach(self, *, delete_files: bool = True) -> None:
        """Bring every streamed weight back as it was, remove the hooks, free the slots."""

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.detach()
