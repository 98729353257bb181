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

__all__ = [
    "INNER_FIRST",
    "LineBytes",
    "allocated_by_line",
    "as_line_bytes",
    "finding_lines",
    "holder_line",
    "input_lines",
    "input_rows",
    "led_by",
    "lines_of_rows",
    "merge_lines",
    "row_lines",
    "script_input_lines",
]

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


def _row_keys(trace: Trace, rows: np.ndarray, callers: bool) -> tuple[np.ndarray, list[str]]:
    """Each row's line key (a string index, ``-2 - i`` for ``sites[i]``, -1 for none) and the sites."""
    line = trace.events["line"][rows].astype(np.int64)
    return _caller_keys(trace, rows, line) if callers else (line, [])


def lines_of_rows(trace: Trace, rows: np.ndarray, limit: int = 10, callers: bool = True) -> list[LineBytes]:
    """The rows' bytes summed per user line, heaviest first; rows without a line are left out.
    ``callers``: a row allocated during a step counts for the step's call site (see above)."""
    if not len(rows):
        return []
    line, sites = _row_keys(trace, rows, callers)
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


def row_lines(trace: Trace, rows: np.ndarray, callers: bool = True) -> list[tuple[str, int, str] | None]:
    """Each row's user line as ``(file, line, function)`` (None: no line), as ``lines_of_rows``
    groups them (``callers``: a row allocated during a step is its call site's)."""
    if not len(rows):
        return []
    line, sites = _row_keys(trace, rows, callers)
    names: dict[int, tuple[str, int, str]] = {}
    for k in np.unique(line).tolist():
        if k != -1:
            src = parse_line(trace.strings[k] if k >= 0 else sites[-2 - k])
            names[k] = (src.file, src.line, src.function)
    return [names.get(k) for k in line.tolist()]


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


def _line_bytes(trace: Trace, row: int, nbytes: int) -> LineBytes:
    src = parse_line(trace.strings[int(trace.events["line"][row])])
    return LineBytes(src.file, src.line, src.function, nbytes, 1)


def holder_line(
    trace: Trace, start_us: int, end_us: int, live_rows: np.ndarray, call_site: str | None = None
) -> LineBytes | None:
    """The user line that made the last block, among those allocated in ``[start_us, end_us]`` and
    still live at the peak (``live_rows``), that is neither a weight, a buffer nor a step's input;
    with ``call_site`` (the step's caller, ``file:line:function``), a line of the same function.

    Graph retention's keeper: between the step whose graph outlives its iteration and the next
    step, the script builds what keeps that graph (``total_loss += loss``, ``losses.append(loss)``);
    the newest such block is the holder (a graph's saved tensors are made before its root). The
    next step's inputs made in the same window are freed before the peak, or tagged as inputs, and
    a helper the loop calls (a batch loader) runs in another function than the loop's."""
    e = trace.events
    rows = live_rows[(e["time_us"][live_rows] >= start_us) & (e["time_us"][live_rows] <= end_us)]
    skip = [int(Category.WEIGHT), int(Category.BUFFER), int(Category.INPUT)]
    rows = rows[(e["line"][rows] >= 0) & ~np.isin(e["category"][rows], skip)]
    if call_site is not None and len(rows):
        site = parse_line(call_site)
        same = []
        for i in np.unique(e["line"][rows]).tolist():
            src = parse_line(trace.strings[int(i)])
            if (src.file, src.function) == (site.file, site.function):
                same.append(int(i))
        rows = rows[np.isin(e["line"][rows], same)]
    if not len(rows):
        return None
    last = int(rows[np.argmax(e["time_us"][rows])])
    return _line_bytes(trace, last, int(e["nbytes"][last]))


def input_rows(trace: Trace, at_us: int | None = None, free_rows: np.ndarray | None = None) -> np.ndarray:
    """Rows of the blocks tagged ``input`` by the capture (a root call's arguments) that carry a user
    line; with ``at_us`` and ``free_rows`` (the trace's free index: each block's FREE row), only
    those live at ``at_us``. Inputs built outside torch (numpy, a buffer) carry no line."""
    e = trace.events
    rows = _alloc_rows(trace)
    rows = rows[(e["category"][rows] == int(Category.INPUT)) & (e["line"][rows] >= 0)]
    if at_us is None or free_rows is None:
        return rows
    rows = rows[e["time_us"][rows] <= at_us]
    freed = np.searchsorted(e["time_us"], at_us, side="left")  # rows freed before at_us are gone
    return rows[free_rows[rows] >= freed]


def input_lines(
    trace: Trace, at_us: int, free_rows: np.ndarray, limit: int = 3, along: int | None = None
) -> list[LineBytes]:
    """The user lines that made the inputs live at ``at_us`` (``input_rows``), heaviest first, the
    earliest made first among equals; with ``along``, only inputs with an axis of that length (the
    padded ids and mask, not the pixels), all of them when none has one."""
    e = trace.events
    rows = input_rows(trace, at_us, free_rows)
    if along is not None:
        mine = np.array([along in (trace.shape(int(e["shape"][r])) or ()) for r in rows.tolist()], dtype=bool)
        rows = rows[mine] if mine.any() else rows
    if not len(rows):
        return []
    best: dict[int, tuple[int, int]] = {}  # line id -> (bytes, first row)
    for r in rows.tolist():
        key = int(e["line"][r])
        nbytes, first = best.get(key, (0, r))
        best[key] = (nbytes + int(e["nbytes"][r]), min(first, r))
    order = sorted(best.items(), key=lambda kv: (-kv[1][0], kv[1][1]))[:limit]
    return [_line_bytes(trace, first, nbytes) for _, (nbytes, first) in order]


def script_input_lines(
    trace: Trace,
    rows: np.ndarray,
    call_sites: set[str],
    *,
    floating: bool = False,
    varying: bool = False,
    limit: int = 3,
) -> list[LineBytes]:
    """The lines that made the input blocks ``rows``, heaviest first, in the files of ``call_sites``
    (the script's lines that call the model, ``file:line:function``).

    What a step is fed is decided where the script builds it: an image resized, frames sampled, a
    batch cut to its length. A helper module the script calls (a shared ``prompt(n)``) makes a tensor
    of whatever size it is asked for; its line is not where the size is chosen, and is left out (the
    call comes next in a finding's lines). ``floating``: floating-point blocks only (pixel values,
    audio features: media, not token ids or masks). ``varying``: only lines whose blocks come in more
    than one shape (the inputs that change from call to call)."""
    if not len(rows) or not call_sites:
        return []
    e = trace.events
    files = {parse_line(site).file for site in call_sites}
    if floating:
        is_float = np.array([(n or "").startswith(("float", "bfloat")) for n in trace.strings] + [False])
        rows = rows[is_float[e["dtype"][rows]]]
    found = []
    for key in np.unique(e["line"][rows]).tolist():
        src = parse_line(trace.strings[int(key)])
        mine = rows[e["line"][rows] == key]
        if src.file not in files or (varying and len(np.unique(e["shape"][mine])) < 2):
            continue
        found.append(LineBytes(src.file, src.line, src.function, int(e["nbytes"][mine].sum()), len(mine)))
    return sorted(found, key=lambda x: -x.nbytes)[:limit]


def as_line_bytes(x: dict[str, Any]) -> LineBytes:
    """A ``{file, line, nbytes}`` of ``finding_lines`` as a LineBytes (to merge with others)."""
    return LineBytes(str(x["file"]), int(x["line"]), "", int(x["nbytes"]), 0)


def led_by(
    first: list[LineBytes], trace: Trace, where: str, live_rows: np.ndarray, pattern: str, limit: int = 3
) -> list[dict[str, Any]]:
    """A finding's lines when its detector knows where the fix goes: ``first``, then the lines
    ``finding_lines`` names for ``where`` (those diagnose() would give it), each once."""
    held = [as_line_bytes(x) for x in finding_lines(trace, where, live_rows, limit, pattern)]
    return merge_lines(first, held, limit=limit)


def merge_lines(*groups: list[LineBytes], limit: int = 3) -> list[dict[str, Any]]:
    """``{file, line, nbytes}`` of the groups' lines in order, each line once, up to ``limit``."""
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, int]] = set()
    for group in groups:
        for x in group:
            if (x.file, x.line) not in seen:
                seen.add((x.file, x.line))
                out.append({"file": x.file, "line": x.line, "nbytes": x.nbytes})
    return out[:limit]
