"""The event log of a meta capture: it stands in for the native recorder
(:mod:`memwarden.record.native`), with storage identities where the native one has addresses.

Every new output storage of an op is an ALLOC of ``storage.nbytes()`` bytes at a fake address; a
weakref on the storage object (whose lifetime is the storage's) records the FREE the moment the
last tensor using it dies, exactly when the CPU allocator would free it. Storages alive before
the capture (weights, buffers, inputs) get fake addresses above ``_PRE_BASE`` and become
PREEXISTING records of the :class:`CaptureLog`.

The recorder sits on the hot path (tens of thousands of ops for a 7B model), so an event is one
tuple appended to one list; the columns are built when the capture drains.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from memwarden.record.attribution.log import CaptureLog, StorageRecord
from memwarden.record.meta.ops import Block, storage_key
from memwarden.record.native import NativeRecord

__all__ = ["MetaLog", "Recorder"]

_FAKE_BASE = 1 << 44  # fake addresses of allocated blocks; preexisting ones sit above _PRE_BASE
_PRE_BASE = 1 << 52
_ALIGN = 64
# Event tuple: the native drain's columns but ``written`` (kept apart: an in-place op raises it later).
_COLUMNS = ("time_ns", "ptr", "nbytes", "id", "ctx", "op_outer", "op_inner", "shape_off", "ndim", "dtype", "action")
_TYPES = {
    "time_ns": np.int64,
    "ptr": np.int64,
    "nbytes": np.int64,
    "id": np.int64,
    "ctx": np.int32,
    "op_outer": np.int32,
    "op_inner": np.int32,
    "shape_off": np.int32,
    "ndim": np.int16,
    "dtype": np.int16,
    "action": np.uint8,
    "written": np.int64,
}


class Recorder:
    """Stands in for ``memwarden.record.native``: ``now_ns``, ``enter``/``exit``, ``drain``."""

    def __init__(self) -> None:
        self._clock = 0
        self.recording = False
        self._events: list[tuple[int, ...]] = []
        self._written: list[int] = []
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
        self.writes = 0  # in-place writes into existing blocks so far (a replayed call must make none)
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
            self._push(NativeRecord.ENTER, 0, 0, ctx, None)
            self._ctx.append(int(ctx))

    def exit(self, ctx: int) -> None:
        if not self.recording:
            return
        while self._ctx:
            if self._ctx.pop() == ctx:
                break
        self._push(NativeRecord.EXIT, 0, 0, ctx, None)

    def scalar_type_names(self) -> list[str]:
        return list(self._dtypes)

    def drain(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        table = np.array(self._events, dtype=np.int64).reshape(len(self._events), len(_COLUMNS))
        for i, name in enumerate(_COLUMNS):
            out[name] = table[:, i].astype(_TYPES[name])
        out["written"] = np.asarray(self._written, dtype=_TYPES["written"])
        out["shapes"] = np.asarray(self._shapes, dtype=np.int64)
        out["op_names"] = list(self._ops)
        out["untracked_frees"] = 0
        out["unwrapped_allocations"] = 0
        out["live_at_drain"] = len(self.blocks)
        return out

    # events
    def _push(
        self,
        action: NativeRecord,
        ptr: int,
        nbytes: int,
        ident: int,
        op: str | None,
        dtype: int = -1,
        shape_off: int = -1,
        ndim: int = 0,
        written: int = -1,
    ) -> int:
        row = len(self._events)
        name = op or self.op
        if name is None:
            op_id = -1
        else:
            op_id = self._op_ids.get(name, -1)
            if op_id < 0:
                op_id = self._op_ids[name] = len(self._ops)
                self._ops.append(name)
        now = self._clock = max(time.perf_counter_ns(), self._clock + 1000)
        ctx = self._ctx[-1] if self._ctx else -1
        self._events.append((now, ptr, nbytes, ident, ctx, op_id, op_id, shape_off, ndim, dtype, action))
        self._written.append(written)
        return row

    def _dtype_id(self, dtype: torch.dtype) -> int:
        index = self._dtype_ids.get(dtype)
        if index is None:
            index = self._dtype_ids[dtype] = len(self._dtypes)
            self._dtypes.append(str(dtype).replace("torch.", ""))
        return index

    def alloc(
        self,
        nbytes: int,
        *,
        op: str | None,
        dtype: torch.dtype | None,
        shape: tuple[int, ...] | None,
        written: int = -1,
    ) -> Block:
        """A block that no storage owns (a kernel's work buffer): free it with :meth:`free`."""
        ident = self._next_id
        self._next_id += 1
        ptr = _FAKE_BASE + ident * _ALIGN
        dtype_id = -1 if dtype is None else self._dtype_id(dtype)
        shape_off, ndim = -1, 0
        if shape is not None:
            shape_off, ndim = len(self._shapes), len(shape)
            self._shapes.extend(int(d) for d in shape)
        row = self._push(NativeRecord.ALLOC, ptr, nbytes, ident, op, dtype_id, shape_off, ndim, written)
        return Block(ident, ptr, nbytes, row)

    def free(self, block: Block) -> None:
        if self.recording:
            self._push(NativeRecord.FREE, block.ptr, block.nbytes, block.id, None)

    def note_storage(self, t: torch.Tensor, inputs: list[torch.Tensor], op: str | None) -> None:
        """Record the storage behind op output ``t`` if it is new (or was resized)."""
        self.note_outputs([t], inputs, op)

    def note_outputs(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], op: str | None) -> None:
        """Record the storages behind an op's outputs that are new (or were resized).

        ``written`` of a new block is the bytes of the inputs on other storages (what the op
        read to fill it); an op writing into an existing block of the same size (in place)
        adds them to that block's count.
        """
        sources: list[tuple[int, int]] | None = None  # (storage identity, data bytes) of each input
        for t in outputs:
            found = storage_key(t)
            if found is None:
                continue
            key, st = found
            nbytes = int(st.nbytes())
            block = self.blocks.get(key)
            if block is None and (key in self.preexisting or nbytes == 0):
                continue
            if sources is None:
                sources = _sources(inputs)
            read = sum(n for k, n in sources if k != key)
            if block is not None:
                if block.nbytes == nbytes:
                    if read and any(k == key for k, _ in sources):
                        self._written[block.event] = max(self._written[block.event], 0) + read
                        self.writes += 1
                    continue
                # resized in place: the CPU allocator hands out a new block and frees the old one
                del self.blocks[key]
                block.ref = None
                self.free(block)
            self.adopt(self.alloc(nbytes, op=op, dtype=t.dtype, shape=tuple(t.shape), written=read), st)

    def adopt(self, block: Block, st: Any) -> None:
        """Make ``block`` the one of storage ``st``: its FREE is logged when the storage dies."""
        key = st._cdata
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


def _sources(inputs: list[torch.Tensor]) -> list[tuple[int, int]]:
    """(storage identity, data bytes) of each input that has a storage (``storage_key``/``data_bytes`` in one)."""
    out = []
    for x in inputs:
        try:
            st = x.untyped_storage()
        except (NotImplementedError, RuntimeError, TypeError):
            continue
        out.append((st._cdata, min(x.numel() * x.element_size(), st.nbytes())))
    return out


class MetaLog(CaptureLog):
    """CaptureLog whose tags find blocks by storage identity (meta tensors have no address)."""

    recorder: Recorder

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
