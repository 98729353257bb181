"""What the Python side sees during a capture, in the recorder's clock (ns).

The hooks fill a ``CaptureLog`` on the hot path, so each observation is a tuple or a small
record appended to a list; attribution reads it once, when the capture stops.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memwarden.record.foreign import ForeignFinder, is_foreign
from memwarden.record.inputs import label_padding, mask_padding
from memwarden.record.modality import input_modality
from memwarden.trace.model import Modality, Phase

__all__ = ["SAVED", "CaptureLog", "StepRecord", "StorageRecord", "storage_of"]

SAVED = "saved"  # the tag kind of a tensor autograd saved for backward


def storage_of(tensor: Any) -> tuple[int, int] | None:
    """(data pointer, bytes) of a CPU tensor's storage; None for tensors without one
    (meta, functorch batched, sparse, nested, wrapper subclasses)."""
    try:
        if tensor.device.type != "cpu" or tensor.is_meta:
            return None
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        return (ptr, storage.nbytes()) if ptr else None
    except (NotImplementedError, RuntimeError, TypeError, AttributeError):
        return None


@dataclass
class StorageRecord:
    """A storage that the allocator recorder does not see: alive before the capture, mapped from
    a file, or foreign (numpy, a buffer, DLPack: see ``memwarden.record.foreign``). ``freed_ns`` is
    set by a finalizer when the storage dies."""

    ptr: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    file: str | None
    t_ns: int
    freed_ns: int | None = None
    kind: str = "weight"  # the tag kind it was first seen as: its category when no tag names it

    def alive_at(self, t_ns: int) -> bool:
        return self.t_ns <= t_ns and (self.freed_ns is None or t_ns <= self.freed_ns)


@dataclass
class StepRecord:
    """A root call while it runs: mutable, because its end (and, for a model first seen inside
    its own call, its phase and inputs) is known only after the call returns."""

    start_ns: int
    ctx: int  # the root module's context
    phase: Phase
    seq_len: int | None
    end_ns: int | None = None
    tokens: dict[str, int] = field(default_factory=dict)  # tokens fed, by modality
    batch: int | None = None
    input_ids: tuple[int, ...] = ()  # the first ids of the first row
    grad: bool | None = None  # autograd recording when the call began (grad mode on, not inference mode)
    media_digests: tuple[str, ...] = ()  # digests of the media items it was sent (inputs.media_digests)

    def set_inputs(self, phase: Phase, seq_len: int | None, info: dict[str, Any] | None) -> None:
        """``info`` as ``memwarden.record.inputs.step_tokens`` returns it (None: no input_ids)."""
        info = info or {}
        self.phase, self.seq_len = phase, seq_len
        self.tokens = dict(info.get("tokens", {}))
        self.batch = info.get("batch")
        self.input_ids = tuple(info.get("input_ids", ()))
        self.media_digests = tuple(info.get("media_digests", ()))


@dataclass
class CaptureLog:
    """What the Python side saw during the run, in the recorder's clock (ns)."""

    tags: list[tuple[int, int, str, str]] = field(default_factory=list)  # (t_ns, ptr, kind, module path)
    fingerprints: list[str | None] = field(default_factory=list)  # one per ENTER marker, in order
    steps: list[StepRecord] = field(default_factory=list)
    optimizer_spans: list[list[int]] = field(default_factory=list)  # [start_ns, end_ns], end -1 while running
    preexisting_storages: dict[int, StorageRecord] = field(default_factory=dict)
    mapped_storages: dict[int, StorageRecord] = field(default_factory=dict)
    # Foreign storages not in a file, and mapped ones whose address a later mapping took over.
    foreign_storages: list[StorageRecord] = field(default_factory=list)
    input_modalities: list[tuple[int, int, int]] = field(default_factory=list)  # (t_ns, ptr, Modality)
    # (t_ns, inputs.mask_padding) of an outermost call whose attention mask pads its batch
    call_padding: list[tuple[int, dict[str, int]]] = field(default_factory=list)
    clock: Callable[[], int] | None = None
    recorded: Callable[[int], bool] | None = None  # the recorder logs a block at this address (numpy's data)
    _foreign_live: dict[int, StorageRecord] = field(default_factory=dict, repr=False)
    _finder: ForeignFinder = field(default_factory=ForeignFinder, repr=False)

    def tag(self, t_ns: int, tensor: Any, kind: str, path: str) -> None:
        found = storage_of(tensor)
        if found is not None:
            self.tags.append((t_ns, found[0], kind, path))
            if is_foreign(tensor):
                self.foreign(t_ns, tensor, kind)

    def saved(self, t_ns: int, tensor: Any) -> None:
        """A tensor autograd saved for backward (its pack hook ran now): a ``saved`` tag, which
        names no category of its own (attribution keeps it apart from the other kinds)."""
        found = storage_of(tensor)
        if found is not None:
            self.tags.append((t_ns, found[0], SAVED, ""))

    def input(self, t_ns: int, tensor: Any, path: str, name: str) -> None:
        """A tensor the program fed into an outermost call as argument ``name``: its modality is
        the name's (``pixel_values``: vision), and an attention mask says how padded the batch is."""
        self.tag(t_ns, tensor, "input", path)
        found = storage_of(tensor)
        modality = input_modality(name)
        if found is not None and modality != Modality.SHARED:
            self.input_modalities.append((t_ns, found[0], int(modality)))
        if name in ("attention_mask", "labels"):
            padding = mask_padding(tensor) if name == "attention_mask" else label_padding(tensor)
            if padding is not None:
                self.call_padding.append((t_ns, padding))

    def side_records(self) -> list[StorageRecord]:
        """The storages attribution emits after the preexisting ones, in a fixed order: mapped
        (by address), then foreign (in the order seen)."""
        return [rec for _ptr, rec in sorted(self.mapped_storages.items())] + self.foreign_storages

    def foreign(self, t_ns: int, tensor: Any, kind: str) -> None:
        """A storage PyTorch's allocator did not make, first seen now as ``kind``: recorded once
        while it lives (a mapped one as a file-backed storage)."""
        found = storage_of(tensor)
        if found is None or found[1] == 0:
            return
        ptr = found[0]
        if self.recorded is not None and self.recorded(ptr):  # numpy's data, logged as it was made
            return
        for known in (self.preexisting_storages.get(ptr), self.mapped_storages.get(ptr), self._foreign_live.get(ptr)):
            if known is not None and known.freed_ns is None:
                return
        path = self._finder.file_of(ptr)
        rec = self._record(tensor, t_ns, path)
        if rec is None:
            return
        rec.kind = kind
        if path is None:
            self.foreign_storages.append(rec)
            self._foreign_live[ptr] = rec
            return
        old = self.mapped_storages.get(ptr)
        if old is not None:  # a file mapped where an earlier, released one was: keep both
            self.foreign_storages.append(old)
        self.mapped_storages[ptr] = rec

    def enter(self, ctx: int, fingerprint: str | None) -> None:
        self.fingerprints.append(fingerprint)

    def step_start(
        self, t_ns: int, ctx: int, phase: Phase, seq_len: int | None, info: dict[str, Any] | None = None
    ) -> None:
        step = StepRecord(start_ns=t_ns, ctx=ctx, phase=phase, seq_len=seq_len)
        step.set_inputs(phase, seq_len, info)
        self.steps.append(step)

    def fix_step(self, phase: Phase, seq_len: int | None, info: dict[str, Any] | None) -> None:
        if self.steps:
            self.steps[-1].set_inputs(phase, seq_len, info)

    def step_end(self, t_ns: int) -> None:
        if self.steps and self.steps[-1].end_ns is None:
            self.steps[-1].end_ns = t_ns

    def optimizer_start(self, t_ns: int) -> None:
        self.optimizer_spans.append([t_ns, -1])

    def optimizer_end(self, t_ns: int) -> None:
        if self.optimizer_spans and self.optimizer_spans[-1][1] < 0:
            self.optimizer_spans[-1][1] = t_ns

    def _record(self, tensor: Any, t_ns: int, file: str | None) -> StorageRecord | None:
        found = storage_of(tensor)
        if found is None or found[1] == 0:
            return None
        storage = tensor.untyped_storage()
        ptr = found[0]
        rec = StorageRecord(ptr, found[1], str(tensor.dtype).replace("torch.", ""), tuple(tensor.shape), file, t_ns)
        if self.clock is not None:
            clock = self.clock

            def _freed(rec: StorageRecord = rec) -> None:
                rec.freed_ns = clock()

            weakref.finalize(storage, _freed)
        return rec

    def preexisting(self, tensor: Any, maps: Any) -> None:
        found = storage_of(tensor)
        if found is None:
            return
        ptr = found[0]
        if ptr in self.preexisting_storages:
            return
        foreign = self._foreign_live.get(ptr)
        if foreign is not None and foreign.freed_ns is None:
            return  # recorded already, from when it was first seen: one storage, one row
        # Memory PyTorch's allocator made is never file-backed: only a foreign storage is looked up.
        rec = self._record(tensor, 0, maps.file_of(ptr) if is_foreign(tensor) else None)
        if rec is not None:
            self.preexisting_storages[ptr] = rec

    def file_backed(self, t_ns: int, tensor: Any, maps: Any) -> None:
        """A storage that lies in a mapped file, first seen at ``t_ns``."""
        found = storage_of(tensor)
        if found is None:
            return
        ptr = found[0]
        if ptr in self.preexisting_storages or ptr in self.mapped_storages or not is_foreign(tensor):
            return  # known already, or made by PyTorch's allocator (never file-backed)
        path = maps.file_of(ptr)
        if path is None:
            return
        rec = self._record(tensor, t_ns, path)
        if rec is not None:
            self.mapped_storages[ptr] = rec
