"""Bytes per line of the user's code: the ``line`` event column grouped.

Every allocation carries the innermost frame of the user's code that made it (``"file:line:
function"``, see memwarden.trace.sites); these views sum blocks by that line, so a summary can
say which lines hold the peak and a finding where its fix goes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from memwarden.trace.model import Action, Trace
from memwarden.trace.sites import parse_line

__all__ = ["LineBytes", "finding_lines", "lines_of_rows"]


@dataclass(frozen=True)
class LineBytes:
    """Bytes a line of the user's code allocated (in the rows asked about)."""

    file: str
    line: int
    function: str
    nbytes: int
    count: int  # blocks

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def label(self) -> str:
        return f"{self.file}:{self.line}"


def lines_of_rows(trace: Trace, rows: np.ndarray, limit: int = 10) -> list[LineBytes]:
    """The rows' bytes summed per user line, heaviest first; rows without a line are left out."""
    if not len(rows):
        return []
    line = trace.events["line"][rows]
    has = line >= 0
    if not has.any():
        return []
    ids, inverse = np.unique(line[has], return_inverse=True)
    nbytes = np.bincount(inverse, weights=trace.events["nbytes"][rows][has].astype(np.float64))
    counts = np.bincount(inverse)
    order = np.argsort(-nbytes, kind="stable")[:limit]
    out = []
    for k in order.tolist():
        src = parse_line(trace.strings[int(ids[k])])
        out.append(LineBytes(src.file, src.line, src.function, int(nbytes[k]), int(counts[k])))
    return out


def _alloc_rows(trace: Trace) -> np.ndarray:
    a = trace.events["action"]
    return np.flatnonzero((a == Action.ALLOC) | (a == Action.PREEXISTING) | (a == Action.MAP))


def finding_lines(trace: Trace, where: str, live_rows: np.ndarray, limit: int = 3) -> list[dict[str, Any]]:
    """The user lines a finding's evidence came from, as ``{file, line, nbytes}``.

    The finding's blocks are those its ``where`` names (a module path and what runs inside it, or an
    op); the lines holding the most of them at the peak come first, else the lines that allocated
    the most of them over the run. Without any, the lines holding the most at the peak."""
    rows = _alloc_rows(trace)
    names = [s == where or s.startswith(where + ".") for s in trace.strings] if where else []
    chosen = rows[:0]
    if any(names):
        named = np.flatnonzero(np.array(names, dtype=bool))
        e = trace.events
        chosen = rows[np.isin(e["module"][rows], named) | np.isin(e["op"][rows], named)]
    at_peak = np.intersect1d(chosen, live_rows) if len(chosen) else chosen
    found = lines_of_rows(trace, at_peak, limit) or lines_of_rows(trace, chosen, limit)
    if not found:
        found = lines_of_rows(trace, live_rows, limit)
    return [{"file": x.file, "line": x.line, "nbytes": x.nbytes} for x in found]
