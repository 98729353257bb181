"""Replayed decompositions: a composite op (``linear``, ``matmul``, ``reshape``) seen before with the
same operands logs the same events and returns the same outputs without running its decomposition.

Why: in inference mode a composite op reaches the capture whole and is decomposed under it, so
one ``linear`` is six dispatches through Python (``t``, ``matmul``, ``view``, ``mm``,
``_unsafe_view``) for one allocation, and a 7B decoder makes thousands of identical calls.

What is replayed: the decomposition's ALLOC/FREE events (sizes, dtypes, shapes, written bytes,
in order), then its outputs, each either a view of an input or a tensor on a block made during
the call (rebuilt on a fresh storage of the block's size and adopted by the recorder, so its
FREE comes when it dies, as before). The key holds every operand's metadata, which operands share
a storage, and whether each operand's storage is a logged block, a preexisting one or neither.
A first call is kept only if its events are exactly that: no module enter/exit, no oracle
answer, no write into or free of a block made before the call, no block left alive that no
output holds, every event under the op being dispatched, and outputs that are plain meta
tensors. Anything else runs its decomposition every time.
"""

from __future__ import annotations

from typing import Any

import torch

from memwarden.record.meta.memo import key_of
from memwarden.record.native import NativeRecord

__all__ = ["Replay"]

_TENSOR = torch._C.TensorBase
_META = torch.device("meta")
_NOT_KEPT = object()
_NBYTES, _ID, _OP, _SHAPE_OFF, _NDIM, _DTYPE, _ACTION = 2, 3, 5, 7, 8, 9, 10  # event tuple fields


class Replay:
    """``run(mode, func, args, kwargs)``: the decomposition of ``func`` under ``mode``, replayed where it can be."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], Any] = {}
        self.hits = 0

    def run(self, mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], operands: list[Any]) -> Any:
        rec = mode.rec
        key = _key(func, args, kwargs, operands, rec)
        entry = self._entries.get(key) if key is not None else _NOT_KEPT
        if entry is _NOT_KEPT:
            with mode:
                return func.decompose(*args, **kwargs)
        if entry is not None:
            self.hits += 1
            return _replay(entry, rec, operands)  # type: ignore[arg-type]
        first_row, first_id, oracle, writes = len(rec._events), rec._next_id, sum(rec.oracle.values()), rec.writes
        with mode:
            out = func.decompose(*args, **kwargs)
        self._entries[key] = _entry(rec, out, operands, first_row, first_id, oracle, writes) or _NOT_KEPT
        return out


def _key(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], operands: list[Any], rec: Any) -> Any:
    parts: list[Any] = [id(func)]
    if not key_of(args, parts) or not key_of(kwargs.values(), parts):
        return None
    parts.append(tuple(kwargs))
    seen: dict[int, int] = {}
    for i, t in enumerate(operands):
        if not t.is_meta:
            return None
        st = t.untyped_storage()._cdata
        kind = 1 if st in rec.blocks else 2 if st in rec.preexisting else 3
        parts.append((seen.setdefault(st, i), kind))
    return tuple(parts)


def _entry(
    rec: Any, out: Any, operands: list[Any], first_row: int, first_id: int, oracle: int, writes: int
) -> tuple[Any, ...] | None:
    """What replays this call, or None where a replay would not log the same events."""
    if not rec.recording or sum(rec.oracle.values()) != oracle or rec.writes != writes:
        return None
    op_id = rec._op_ids.get(rec.op, -1)
    dtypes = {i: d for d, i in rec._dtype_ids.items()}
    events: list[tuple[Any, ...]] = []
    index_of: dict[int, int] = {}  # block id -> its position among this call's allocations
    for row in range(first_row, len(rec._events)):
        e = rec._events[row]
        if e[_OP] != op_id or e[_ID] < first_id:
            return None
        if e[_ACTION] == NativeRecord.ALLOC:
            shape = tuple(rec._shapes[e[_SHAPE_OFF] : e[_SHAPE_OFF] + e[_NDIM]]) if e[_SHAPE_OFF] >= 0 else None
            index_of[e[_ID]] = len(index_of)
            events.append((True, e[_NBYTES], dtypes.get(e[_DTYPE]), shape, rec._written[row]))
        elif e[_ACTION] == NativeRecord.FREE and e[_ID] in index_of:
            events.append((False, index_of[e[_ID]]))
        else:
            return None
    inputs = {t.untyped_storage()._cdata: i for i, t in enumerate(operands)}
    live = {b.id: k for k, b in rec.blocks.items() if b.id >= first_id}
    if any(k in inputs for k in live.values()):
        return None
    held: set[int] = set()

    def spec(t: Any) -> Any:
        if isinstance(t, list):
            return [spec(x) for x in t]
        if isinstance(t, tuple):
            return ("tuple", *(spec(x) for x in t))
        if type(t) is not torch.Tensor or not t.is_meta or t.is_conj() or t.is_neg():
            raise ValueError
        st = t.untyped_storage()
        layout = (tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)
        if st._cdata in inputs:
            return ("input", inputs[st._cdata], *layout)
        block = rec.blocks.get(st._cdata)
        if block is None or block.id < first_id or st.nbytes() != block.nbytes:
            raise ValueError
        held.add(block.id)
        return ("block", index_of[block.id], *layout)

    try:
        outputs = spec(out)
    except ValueError:
        return None
    if set(live) != held:  # a block made here is kept alive by something other than the outputs
        return None
    return tuple(events), outputs


def _replay(entry: tuple[Any, ...], rec: Any, operands: list[Any]) -> Any:
    events, outputs = entry
    blocks: list[Any] = []
    for e in events:
        if e[0]:
            blocks.append(rec.alloc(e[1], op=None, dtype=e[2], shape=e[3], written=e[4]))
        else:
            rec.free(blocks[e[1]])
    return _build(outputs, blocks, {}, rec, operands)


def _build(spec: Any, blocks: list[Any], storages: dict[int, Any], rec: Any, operands: list[Any]) -> Any:
    # Module-level, not a closure: a recursive closure is a reference cycle, and the storages it
    # held would die at the next garbage collection instead of when their tensors do.
    if isinstance(spec, list):
        return [_build(x, blocks, storages, rec, operands) for x in spec]
    if spec[0] == "tuple":
        return tuple(_build(x, blocks, storages, rec, operands) for x in spec[1:])
    kind, index, shape, stride, offset, dtype = spec
    if kind == "input":
        st = operands[index].untyped_storage()
    else:
        st = storages.get(index)
        if st is None:
            block = blocks[index]
            st = storages[index] = torch.empty(block.nbytes, dtype=torch.uint8, device=_META).untyped_storage()
            rec.adopt(block, st)
    return torch.empty(0, dtype=dtype, device=_META).set_(st, offset, shape, stride)
