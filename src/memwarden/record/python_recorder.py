"""The recorder a live capture runs with: the native one (native.cpp) where it can be built, else a
pure-Python stand-in with the same interface, so that a machine without a C++ compiler still gets
a trace, with one warning instead of a failure.

The stand-in is the meta capture's recorder (:mod:`memwarden.record.meta.recorder`) fed by a
TorchDispatchMode over the real CPU run: every op output whose storage is new (not one of the
op's inputs' storages: views and in-place ops allocate nothing) is an ALLOC of
``storage.nbytes()`` at the storage's real address, and a weakref on the storage object logs the
FREE when it dies, as the CPU allocator frees it. What it does not see, and the native recorder
does: blocks a kernel allocates and frees inside one op (workspaces, a composite op's
intermediates), numpy's data, the user's source line of each block, and the crash ring
(``--ring`` needs the native recorder). The trace says which recorder made it
(``metadata["capture"]``: ``memwarden-python-cpu``).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memwarden.record import native
from memwarden.record.meta.ops import Block, storage_key, tensors
from memwarden.record.meta.recorder import Recorder
from memwarden.record.native import NativeRecord
from memwarden.trace.stream import RAW_EVENT_DTYPE

__all__ = ["PythonRecorder", "recorder"]

PYTHON_CAPTURE = "memwarden-python-cpu"  # metadata["capture"] of a trace the stand-in recorded
# Interned first, so a stream's header (written before the first op) names the dtypes its rows use.
_DTYPES = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
_warned: list[str] = []
# The columns of a recorder row tuple, in order (the raw row's first 11: all but ``site`` and ``written``).
_ROW_COLUMNS = ("t_ns", "ptr", "nbytes", "id", "ctx", "op_outer", "op_inner", "shape_off", "ndim", "dtype", "action")


def recorder(metadata: dict[str, Any]) -> Any:
    """The native recorder, or (where it cannot be built) a :class:`PythonRecorder` with one line on
    stderr, once per process; ``metadata`` then says so (``capture``, ``native_unavailable``)."""
    try:
        return native.load()
    except native.NativeUnavailable as exc:
        reason = " ".join(str(exc).split())[:300]
        if not _warned:
            _warned.append(reason)
            print(
                f"memwarden: warning: {native.short_reason(exc)}; capturing with the pure-Python recorder "
                "(slower; no kernel workspaces, numpy data or source lines)",
                file=sys.stderr,
            )
        metadata["capture"] = PYTHON_CAPTURE
        metadata["native_unavailable"] = reason
        return PythonRecorder()


class _Mode(TorchDispatchMode):
    """Runs every op as it is and tells the recorder about its outputs."""

    def __init__(self, rec: PythonRecorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        rec = self.rec
        outer = rec.op
        if outer is None:
            rec.op = func._schema.name
        try:
            out = func(*args, **kwargs)
            if rec.recording:
                rec.note_live(tensors(out), tensors((args, kwargs)))
            return out
        finally:
            rec.op = outer


class PythonRecorder(Recorder):
    """The native recorder's interface (``start``/``stop``, ``enter``/``exit``, ``drain``,
    ``stream_since``) in Python, over a dispatch mode; addresses are the storages' real ones, so
    the capture's own tags (found by address) name its blocks."""

    def __init__(self) -> None:
        super().__init__()
        for dtype in _DTYPES:
            self._dtype_id(dtype)
        self._mode: _Mode | None = None

    def start(self, record_ops: bool = True) -> None:
        super().start(record_ops)
        self._mode = _Mode(self)
        self._mode.__enter__()

    def stop(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)
        super().stop()

    def note_live(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> None:
        """ALLOC the storages behind ``outputs`` that are new: neither an input's (a view, an
        in-place op, ``out=``) nor one already recorded (unless it was resized)."""
        if not outputs:
            return
        read = {found[0] for x in inputs if (found := storage_key(x)) is not None}
        for t in outputs:
            if t.device.type != "cpu":
                continue
            found = storage_key(t)
            if found is None or found[0] in read:
                continue
            key, st = found
            nbytes = int(st.nbytes())
            block = self.blocks.get(key)
            if block is not None:
                if block.nbytes == nbytes:
                    continue
                del self.blocks[key]  # resized in place: a new block, the old one freed
                block.ref = None
                self.free(block)
            if nbytes == 0:
                continue
            ident = self._next_id
            self._next_id += 1
            shape_off, ndim = len(self._shapes), t.dim()
            self._shapes.extend(int(d) for d in t.shape)
            ptr = int(st.data_ptr())
            row = self._push(NativeRecord.ALLOC, ptr, nbytes, ident, self.op, self._dtype_id(t.dtype), shape_off, ndim)
            self.adopt(Block(ident, ptr, nbytes, row), st)

    # the streamer's interface (record/live/stream.py)
    def stream_since(self, ev_start: int, shape_start: int, op_start: int) -> tuple[bytes, int, bytes, int, list[str]]:
        """(rows as the native recorder lays them out, rows so far, shapes, shape values so far, op
        names interned since)."""
        # The run appends from another thread: a row's ``written`` goes in just after it, so take
        # only the rows whose ``written`` is there too.
        events, shapes, ops = self._events[ev_start:], self._shapes[shape_start:], self._ops[op_start:]
        events = events[: max(0, len(self._written) - ev_start)]
        rows = np.zeros(len(events), dtype=RAW_EVENT_DTYPE)
        if events:
            table = np.array(events, dtype=np.int64)
            for i, name in enumerate(_ROW_COLUMNS):
                rows[name] = table[:, i]
            rows["site"] = -1
            rows["written"] = self._written[ev_start : ev_start + len(events)]
        dims = np.asarray(shapes, dtype=np.int64)
        return rows.tobytes(), ev_start + len(events), dims.tobytes(), shape_start + len(shapes), list(ops)

    def site_names_since(self, start: int) -> list[str]:
        return []  # no source lines
