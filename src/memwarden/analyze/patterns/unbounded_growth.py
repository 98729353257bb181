"""unbounded-growth: memory that grows iteration after iteration and is never given back.

The commonest way a long run dies: a list that keeps every step's outputs (often with their
autograd graphs), a cache without a bound, a history appended to per request. Each iteration
leaves a little more alive, until something outside kills the process.

What the trace shows: blocks still alive at the end of the trace (for a killed run: at its
death), grouped by the line of the user's code that allocated them. A line grows without bound
when its survivors were allocated all along the run, not in one burst: the rows from the line's
first allocation to the end of the trace are cut into ``bins`` (4) equal parts by event order
(not by time, so the verdict does not depend on the machine's speed), and survivors must lie in
at least ``min_bins`` (3) of them, the last included, and number at least ``min_blocks`` (4).
That tells growth from the two shapes that look like it:

- a warm-up that plateaus (buffers made in the first iterations, kept, then nothing more): its
  survivors all lie in the first part;
- a bounded cache (a deque with ``maxlen``, a dict overwritten per key): its survivors are the
  last few, all in the last part.

Weights, buffers, gradients, optimizer state and KV caches are left out (they are meant to stay;
their own patterns judge them). An iteration is a step (a root module call) when the trace has
steps, else one survivor.

Waste: the bytes the line keeps; growth per iteration: those bytes over the iterations they span.
The fix is computed for the container bounded to the last ``bound_iterations`` (4) iterations'
blocks, the size the fix names: an LRU of 4 images, a deque of 4 turns.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding, severity_for
from memwarden.analyze.lines import LineBytes, merge_lines
from memwarden.analyze.source_lines import SourceLine, entry_files, keeper_line, script_files, script_line
from memwarden.analyze.window_read import Window, window_read
from memwarden.trace.model import Action, Category, Trace
from memwarden.trace.sites import parse_line
from memwarden.units import format_bytes

PATTERN = "unbounded-growth"
_MEANT_TO_STAY = (Category.WEIGHT, Category.BUFFER, Category.GRADIENT, Category.OPTIMIZER_STATE, Category.KV_CACHE)


def detect(ctx: Context) -> list[Finding]:
    trace = ctx.trace
    n = trace.num_events
    if not n:
        return []
    bins = int(ctx.threshold(PATTERN, "bins", 4))
    min_bins = int(ctx.threshold(PATTERN, "min_bins", 3))
    min_blocks = int(ctx.threshold(PATTERN, "min_blocks", 4))
    bound = max(1, int(ctx.threshold(PATTERN, "bound_iterations", 4)))  # the fix's container size
    e = trace.events
    device = ctx.analysis.device
    allocs = np.flatnonzero((e["action"] == Action.ALLOC) & (e["device"] == device) & (e["line"] >= 0))
    if not len(allocs):
        return []
    allocs = allocs[~np.isin(e["category"][allocs], np.array(_MEANT_TO_STAY, dtype=np.uint8))]
    free = ctx.analysis.free_index
    step_starts = np.array(sorted(s.start_us for s in ctx.analysis.steps), dtype=np.int64)
    peak = ctx.summary.peak_bytes
    # Survivors at the end of the trace (for a killed run: its death), and at its peak: a container
    # local to the script's main() is freed when main returns, before the capture ends, and what it
    # held is alive at the peak it made. Per line, the moment that keeps more.
    peak_row = int(np.argmax(ctx.analysis.live_bytes))
    best: dict[int, Finding] = {}
    for end in (n, peak_row + 1):
        survivors = allocs[(allocs < end) & (free[allocs] >= end)]
        for line_id in np.unique(e["line"][survivors]).tolist():
            kept = survivors[e["line"][survivors] == line_id]
            if len(kept) < min_blocks:
                continue
            first = int(allocs[e["line"][allocs] == line_id][0])
            edges = np.linspace(first, end, bins + 1)
            which = np.clip(np.searchsorted(edges, kept, side="right") - 1, 0, bins - 1)
            occupied = np.unique(which)
            if len(occupied) < min_bins or occupied[-1] != bins - 1:
                continue
            window = _window_of(ctx, int(line_id))
            finding: Finding | None
            if window is not None:  # the script reads the newest few: bounded to them
                e_t = e["time_us"][kept]
                src = parse_line(trace.strings[int(line_id)])
                made = [{"file": src.file, "line": src.line, "nbytes": int(e["nbytes"][kept].sum())}]
                kept_bytes = int(e["nbytes"][kept].sum())
                finding = bounded_window(trace, window, kept, np.arange(len(kept)), e_t, made, kept_bytes, len(kept))
            else:
                finding = _finding(trace, int(line_id), kept, step_starts, peak, bound)
            if finding is not None and finding.wasted_bytes > (best[line_id].wasted_bytes if line_id in best else -1):
                best[line_id] = finding
    return list(best.values())


def _window_of(ctx: Context, line_id: int) -> Window | None:
    """The window the script reads of the container that keeps what ``line_id`` made: the script's
    statement that asks for the value (up from a helper module, ``mel = C.log_mel(...)``), its
    keeper (``self.history.append(mel)``), read through a trailing slice (``self.history[-10:]``)."""
    trace = ctx.trace
    src = parse_line(trace.strings[line_id])
    files = list(dict.fromkeys(script_files([s.call_site or "" for s in ctx.analysis.steps]) + [src.file]))
    script = trace.metadata.get("script")
    entries = entry_files(files, script if isinstance(script, str) else None)
    up = script_line(src.file, src.line, entries) or SourceLine(src.file, src.line, "")
    for file, line in dict.fromkeys([(up.file, up.line), (src.file, src.line)]):
        keeper = keeper_line(file, line)
        for spot in ([(keeper.file, keeper.line)] if keeper else []) + [(file, line)]:
            window = window_read(*spot)
            if window is not None:
                return window
    return None


def _finding(
    trace: Trace, line_id: int, kept: np.ndarray, step_starts: np.ndarray, peak: int, bound: int
) -> Finding | None:
    e = trace.events
    kept_bytes = int(e["nbytes"][kept].sum())
    if len(step_starts):
        steps = np.searchsorted(step_starts, e["time_us"][kept], side="right")
        iterations = int(len(np.unique(steps)))
        unit = "step"
    else:
        steps = np.arange(len(kept))
        iterations = len(kept)
        unit = "iteration"
    if iterations < 2:
        return None
    per_iteration = kept_bytes // iterations
    src = parse_line(trace.strings[line_id])
    label = f"{src.file}:{src.line}"
    evidence: dict[str, Any] = {
        "line": {"file": src.file, "line": src.line, "function": src.function},
        "kept_bytes": kept_bytes,
        "blocks_kept": len(kept),
        "iterations": iterations,
        "iteration": unit,
        "growth_per_iteration_bytes": per_iteration,
        "first_kept_us": int(e["time_us"][kept[0]]),
        "last_kept_us": int(e["time_us"][kept[-1]]),
    }
    # The fix as a change: the container bounded to the newest ``bound`` iterations (an LRU, a deque
    # with maxlen): what an iteration kept is dropped when the one ``bound`` iterations later keeps its own.
    first_of = {int(k): int(kept[np.argmax(steps == k)]) for k in np.unique(steps)}
    order = sorted(first_of)
    evicted_at = {order[i]: first_of[order[i + bound]] for i in range(len(order) - bound)}
    dropped = np.array([k in evicted_at for k in steps.tolist()], dtype=bool)
    free_at = np.array([evicted_at[k] for k in steps[dropped].tolist()], dtype=np.int64)
    evidence["bound_iterations"] = bound
    fix = (
        f"{label} ({src.function}) keeps {format_bytes(per_iteration)} more every {unit} and never gives it back "
        f"({format_bytes(kept_bytes)} over {iterations} {unit}s): keep only what you need (.detach(), .item(), "
        f".cpu() of a slice) or bound the container to the last {bound} (an LRU: collections.OrderedDict with "
        f"popitem(last=False), collections.deque(maxlen={bound}), functools.lru_cache(maxsize={bound}))"
    )
    return Finding(
        pattern=PATTERN,
        severity=severity_for(kept_bytes, peak),
        bytes_at_peak=kept_bytes,
        wasted_bytes=kept_bytes,
        where=label,
        evidence=evidence,
        fix=fix,
        peak_added_bytes=kept_bytes,
        allocated_bytes=kept_bytes,
        lines=[{"file": src.file, "line": src.line, "nbytes": kept_bytes}],
        change=Change(free_rows=kept[dropped], free_at=free_at),
    )


def bounded_window(
    trace: Trace,
    w: Window,
    rows: np.ndarray,
    it: np.ndarray,
    starts: np.ndarray,
    lines: list[dict[str, Any]],
    kept_at_peak: int,
    kept_iterations: int,
) -> Finding:
    """The container keeps an item from every request (``it``: each row's request, ``starts`` their
    start times) but the script reads its last ``w.size``. The fix as a change: an item is dropped
    when the request ``size`` later appends; the line to change is where the container is made."""
    size = max(1, w.items or 2)
    evict = it + size + 1
    has = evict < len(starts)
    times = trace.events["time_us"]
    change = Change(free_rows=rows[has], free_at=np.searchsorted(times, starts[evict[has]], side="left"))
    fix = (
        f"{w.container} keeps every item it is given ({kept_iterations} at the peak, "
        f"{format_bytes(kept_at_peak)}) but the script reads only its last {w.size} (line {w.read_line}): bound it "
        f"where it is made (line {w.binding_line}): {w.container} = collections.deque(maxlen={w.size}) (a bounded deque), so older "
        f"items are dropped as new ones arrive"
    )
    return Finding(
        pattern=PATTERN,
        severity="high",
        bytes_at_peak=kept_at_peak,
        wasted_bytes=kept_at_peak,
        where=f"{w.file}:{w.binding_line}",
        evidence={
            "container": w.container,
            "window": w.size,
            "read_line": w.read_line,
            "iterations_kept_at_peak": kept_iterations,
            "kept_bytes_at_peak": kept_at_peak,
        },
        fix=fix,
        lines=merge_lines(
            [LineBytes(w.file, w.binding_line, "", kept_at_peak, 0)],
            [LineBytes(str(x["file"]), int(x["line"]), "", int(x["nbytes"]), 0) for x in lines],
        ),
        change=change,
    )
