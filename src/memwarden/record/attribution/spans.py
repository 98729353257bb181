"""Stage 1: module-call spans from the recorder's ENTER/EXIT markers, and the innermost call
open at each row (the call that made an allocation)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memwarden.record.native import NativeRecord

__all__ = ["ModuleSpans", "module_spans"]


@dataclass(frozen=True)
class ModuleSpans:
    """One span per ENTER marker, in marker order: span ``i`` is the ``i``-th module call, and
    ``CaptureLog.fingerprints[slot[i]]`` its input fingerprint (``slot`` -1: a nested call the
    native hooks handled alone, which has none; FAST_ENTER in its marker's nbytes says so)."""

    start_ns: np.ndarray  # int64
    end_ns: np.ndarray  # int64; the capture's end for a call that never returned
    ctx: np.ndarray  # int64 module context
    parent: np.ndarray  # int64 span index of the enclosing call, -1 at the top
    depth: np.ndarray  # int64 calls open around it
    row_span: np.ndarray  # per recorder row: the innermost span open at it, -1 = none (and at markers)
    slot: np.ndarray  # int64 index into CaptureLog.fingerprints, -1 = none

    def __len__(self) -> int:
        return len(self.start_ns)

    def first_start_ns(self, default_ns: int) -> int:
        """When the first module call started; ``default_ns`` if none ran."""
        return int(self.start_ns[0]) if len(self.start_ns) else default_ns

    def end_or(self, capture_end_ns: int) -> np.ndarray:
        """Span ends with the capture's end appended, so that span index -1 (outside any call)
        reads the end of the capture."""
        return np.append(self.end_ns, np.int64(capture_end_ns)).astype(np.int64)


FAST_ENTER = -1  # nbytes of an ENTER marker logged by the native hooks' fast path (native.cpp's kFastEnter)


def module_spans(
    action: np.ndarray, ids: np.ndarray, time_ns: np.ndarray, capture_end_ns: int, nbytes: np.ndarray | None = None
) -> ModuleSpans:
    """Pair the markers into calls. An EXIT closes every call opened after its own ENTER too (a
    call cut short by an exception never logs its EXIT)."""
    enter, exit_ = int(NativeRecord.ENTER), int(NativeRecord.EXIT)
    is_marker = (action == enter) | (action == exit_)
    markers = np.flatnonzero(is_marker)
    kinds, ctxs, times = action[markers], ids[markers], time_ns[markers]
    nested = _balanced_spans(kinds == enter, ctxs, times)
    if nested is not None:  # every call returned, in order: whole arrays, no loop
        table, open_after_markers = nested
        open_after = np.concatenate(([-1], open_after_markers))
    else:
        table, open_list = _spans_by_loop(kinds, ctxs, times, capture_end_ns)
        open_after = np.asarray(open_list, dtype=np.int64)
    # A row between two markers lies in the call open after the earlier one; markers lie in none.
    row_span = np.asarray(open_after, dtype=np.int64)[np.cumsum(is_marker)]
    row_span[is_marker] = -1
    enters = np.flatnonzero(action == enter)
    has_slot = np.ones(len(enters), dtype=bool) if nbytes is None else nbytes[enters] != FAST_ENTER
    slot = np.where(has_slot, np.cumsum(has_slot) - 1, -1).astype(np.int64)
    return ModuleSpans(
        start_ns=table[:, 0],
        end_ns=table[:, 1],
        ctx=table[:, 2],
        parent=table[:, 3],
        depth=table[:, 4],
        row_span=row_span,
        slot=slot,
    )


def _balanced_spans(is_enter: np.ndarray, ctxs: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The spans table ([start_ns, end_ns, ctx, parent, depth] per call, in call order) and the
    innermost call open after each marker, for markers that nest like brackets with each EXIT
    naming its ENTER's module (a run whose calls all returned). None otherwise (an exception cut
    a call short, the capture stopped inside one): the loop handles those."""
    step = np.where(is_enter, 1, -1)
    depth_after = np.cumsum(step)
    if len(step) == 0 or depth_after[-1] != 0 or depth_after.min() < 0:
        return None
    # An ENTER from depth L and its EXIT back to L share level L; within a level they alternate.
    level = np.where(is_enter, depth_after - 1, depth_after)
    order = np.argsort(level, kind="stable")
    enter_pos, exit_pos = order[0::2], order[1::2]
    if not (is_enter[enter_pos].all() and not is_enter[exit_pos].any()):
        return None
    if not np.array_equal(ctxs[enter_pos], ctxs[exit_pos]):
        return None
    by_call = np.argsort(enter_pos, kind="stable")
    enter_pos, exit_pos = enter_pos[by_call], exit_pos[by_call]
    depth = level[enter_pos]
    parent = np.full(len(enter_pos), -1, dtype=np.int64)
    calls = np.arange(len(enter_pos))
    for d in range(1, int(depth.max(initial=0)) + 1):  # the latest call one level up, opened before
        outer, inner = calls[depth == d - 1], calls[depth == d]
        parent[inner] = outer[np.searchsorted(outer, inner) - 1]
    table = np.stack([times[enter_pos], times[exit_pos], ctxs[enter_pos], parent, depth], axis=1).astype(np.int64)
    call_of = np.empty(len(is_enter), dtype=np.int64)
    call_of[enter_pos], call_of[exit_pos] = calls, calls
    return table, np.where(is_enter, call_of, parent[call_of])


def _spans_by_loop(
    kinds: np.ndarray, ctxs: np.ndarray, times: np.ndarray, capture_end_ns: int
) -> tuple[np.ndarray, list[int]]:
    """The same, one marker at a time: an EXIT closes every call opened after its ENTER too."""
    enter = int(NativeRecord.ENTER)
    spans: list[list[int]] = []  # [start_ns, end_ns, ctx, parent, depth]
    stack: list[int] = []
    open_after = [-1]  # the innermost call open after each marker (-1 before the first)
    # Plain ints, not numpy scalars: a numpy scalar compared with an IntEnum member probes the
    # member's attributes (Enum.__getattr__), which cost more than the rest of the stage.
    rows = zip(kinds.tolist(), ctxs.tolist(), times.tolist(), strict=True)
    for kind, ctx, t_ns in rows:
        if kind == enter:
            spans.append([t_ns, capture_end_ns, ctx, stack[-1] if stack else -1, len(stack)])
            stack.append(len(spans) - 1)
        else:
            while stack:
                top = stack.pop()
                spans[top][1] = t_ns
                if spans[top][2] == ctx:
                    break
        open_after.append(stack[-1] if stack else -1)
    return np.array(spans, dtype=np.int64).reshape(len(spans), 5), open_after
