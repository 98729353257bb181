"""Bytes per line of the user's code: the ``line`` event column grouped.

Every allocation carries the innermost frame of the user's code that made it (``"file:line:
function"``, see memwarden.trace.sites); these views sum blocks by that line, so a summary can
say which lines hold the peak and a finding where its fix goes.

A model the user wrote is the user's code too, so a block its ``forward`` allocates carries a
line inside that forward. Each step records the script's line that called the model
(``Step.call_site``); a block allocated during a step is the caller's, and these views name the
caller's line for it (``callers=True``, the default): the line that keeps a list of outputs, feeds
the same image again or grows a batch is the call, not a line of the model. Findings whose fix is
inside the model (a concatenated cache, a per-call dequantized copy, padding) name the forward's
line first and the caller's after it (``INNER_FIRST``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from memwarden.trace.model import Action, Category, Trace
from memwarden.trace.sites import parse_line
from memwarden.trace.steps import steps_of

__all__ = ["INNER_FIRST", "LineBytes", "allocated_by_line", "finding_lines", "lines_of_rows"]

# Patterns whose waste a line inside the model makes (its fix goes there), not the call's caller.
INNER_FIRST = frozenset({"kv-concat-growth", "dequant-temporaries", "alignment-padding", "load-spike"})


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


def _caller_keys(trace: Trace, rows: np.ndarray, line: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """``line`` with each row allocated during a step that has a call site replaced by that site:
    keys >= 0 are string ids, key -2 - j is ``sites[j]``."""
    steps = [s for s in steps_of(trace) if s.call_site is not None]
    if not steps:
        return line, []
    sites = sorted({s.call_site for s in steps if s.call_site is not None})
    wanted = set(sites)
    known = {text: i for i, text in enumerate(trace.strings) if text in wanted}
    # a call site that is also some block's own line groups with it under that string's id
    site_key = {text: known.get(text, -2 - j) for j, text in enumerate(sites)}
    start = np.array([s.start_us for s in steps], dtype=np.int64)
    end = np.array([s.end_us for s in steps], dtype=np.int64)
    key = np.array([site_key[s.call_site] for s in steps if s.call_site is not None], dtype=np.int64)
    t = trace.events["time_us"][rows]
    k = np.searchsorted(start, t, side="right") - 1
    inside = (k >= 0) & (t <= end[np.maximum(k, 0)]) & (line >= 0)
    return np.where(inside, key[np.maximum(k, 0)], line), sites


def lines_of_rows(trace: Trace, rows: np.ndarray, limit: int = 10, callers: bool = True) -> list[LineBytes]:
    """The rows' bytes summed per user line, heaviest first; rows without a line are left out.
    ``callers``: a row allocated during a step counts for the step's call site (see above)."""
    if not len(rows):
        return []
    line = trace.events["line"][rows].astype(np.int64)
    sites: list[str] = []
    if callers:
        line, sites = _caller_keys(trace, rows, line)
    has = line != -1
    if not has.any():
        return []
    ids, inverse = np.unique(line[has], return_inverse=True)
    nbytes = np.bincount(inverse, weights=trace.events["nbytes"][rows][has].astype(np.float64))
    counts = np.bincount(inverse)
    order = np.argsort(-nbytes, kind="stable")[:limit]
    out = []
    for k in order.tolist():
        key = int(ids[k])
        src = parse_line(trace.strings[key] if key >= 0 else sites[-2 - key])
        out.append(LineBytes(src.file, src.line, src.function, int(nbytes[k]), int(counts[k])))
    return out


def _alloc_rows(trace: Trace) -> np.ndarray:
    a = trace.events["action"]
    return np.flatnonzero((a == Action.ALLOC) | (a == Action.PREEXISTING) | (a == Action.MAP))


def allocated_by_line(trace: Trace, callers: bool = True) -> dict[tuple[str, int], int]:
    """Bytes each user line allocated over the whole run, by ``(file, line)``."""
    return {(x.file, x.line): x.nbytes for x in lines_of_rows(trace, _alloc_rows(trace), 1 << 30, callers)}


def _working(trace: Trace, rows: np.ndarray, pattern: str | None) -> np.ndarray:
    """``rows`` without weights and buffers (the evidence runs through them; they are not the
    mistake) unless the pattern is about loading them, or nothing else is left."""
    if pattern == "load-spike":
        return rows
    working = rows[~np.isin(trace.events["category"][rows], [int(Category.WEIGHT), int(Category.BUFFER)])]
    return working if len(working) else rows


def finding_lines(
    trace: Trace, where: str, live_rows: np.ndarray, limit: int = 3, pattern: str | None = None
) -> list[dict[str, Any]]:
    """The user lines a finding's evidence came from, as ``{file, line, nbytes}``.

    The finding's blocks are those its ``where`` names (a module path and what runs inside it, or an
    op), weights and buffers aside unless the pattern is about loading them; the lines holding the
    most of them at the peak come first, else the lines that allocated the most of them over the
    run. Without any, the lines holding the most at the peak. The caller's line (a step's call
    site) comes first unless ``pattern`` is one whose fix lies inside the model (``INNER_FIRST``);
    the other view's lines follow, up to ``limit`` in all."""
    rows = _alloc_rows(trace)
    names = [s == where or s.startswith(where + ".") for s in trace.strings] if where else []
    chosen = rows[:0]
    if any(names):
        named = np.flatnonzero(np.array(names, dtype=bool))
        e = trace.events
        chosen = _working(trace, rows[np.isin(e["module"][rows], named) | np.isin(e["op"][rows], named)], pattern)
    at_peak = np.intersect1d(chosen, live_rows) if len(chosen) else chosen
    caller_first = pattern not in INNER_FIRST
    found: list[LineBytes] = []
    for callers in (caller_first, not caller_first):
        view = lines_of_rows(trace, at_peak, limit, callers) or lines_of_rows(trace, chosen, limit, callers)
        if not view and not found:
            view = lines_of_rows(trace, _working(trace, live_rows, pattern), limit, callers)
        found += [x for x in view if (x.file, x.line) not in {(y.file, y.line) for y in found}]
    return [{"file": x.file, "line": x.line, "nbytes": x.nbytes} for x in found[:limit]]
