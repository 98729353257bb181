"""Stage 1: module-call spans from the recorder's ENTER/EXIT markers, and the innermost call
open at each row (the call that made an allocation)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memwarden.capture.native import NativeRecord

__all__ = ["ModuleSpans", "module_spans"]


@dataclass(frozen=True)
class ModuleSpans:
    """One span per ENTER marker, in marker order: span ``i`` is the ``i``-th module call, so
    ``CaptureLog.fingerprints[i]`` is its input fingerprint."""

    start_ns: np.ndarray  # int64
    end_ns: np.ndarray  # int64; the capture's end for a call that never returned
    ctx: np.ndarray  # int64 module context
    parent: np.ndarray  # int64 span index of the enclosing call, -1 at the top
    depth: np.ndarray  # int64 calls open around it
    row_span: np.ndarray  # per recorder row: the innermost span open at it, -1 = none (and at markers)

    def __len__(self) -> int:
        return len(self.start_ns)

    def first_start_ns(self, default_ns: int) -> int:
        """When the first module call started; ``default_ns`` if none ran."""
        return int(self.start_ns[0]) if len(self.start_ns) else default_ns

    def end_or(self, capture_end_ns: int) -> np.ndarray:
        """Span ends with the capture's end appended, so that span index -1 (outside any call)
        reads the end of the capture."""
        return np.append(self.end_ns, np.int64(capture_end_ns)).astype(np.int64)


def module_spans(action: np.ndarray, ids: np.ndarray, time_ns: np.ndarray, capture_end_ns: int) -> ModuleSpans:
    """Pair the markers into calls. An EXIT closes every call opened after its own ENTER too (a
    call cut short by an exception never logs its EXIT)."""
    enter, exit_ = int(NativeRecord.ENTER), int(NativeRecord.EXIT)
    is_marker = (action == enter) | (action == exit_)
    markers = np.flatnonzero(is_marker)
    spans: list[list[int]] = []  # [start_ns, end_ns, ctx, parent, depth]
    stack: list[int] = []
    open_after = [-1]  # the innermost call open after each marker (-1 before the first)
    # Plain ints, not numpy scalars: a numpy scalar compared with an IntEnum member probes the
    # member's attributes (Enum.__getattr__), which cost more than the rest of the stage.
    rows = zip(action[markers].tolist(), ids[markers].tolist(), time_ns[markers].tolist(), strict=True)
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
    # A row between two markers lies in the call open after the earlier one; markers lie in none.
    row_span = np.array(open_after, dtype=np.int64)[np.cumsum(is_marker)]
    row_span[is_marker] = -1
    table = np.array(spans, dtype=np.int64).reshape(len(spans), 5)
    return ModuleSpans(
        start_ns=table[:, 0],
        end_ns=table[:, 1],
        ctx=table[:, 2],
        parent=table[:, 3],
        depth=table[:, 4],
        row_span=row_span,
    )
