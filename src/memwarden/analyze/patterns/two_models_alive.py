"""two-models-alive: a model switched for another without releasing the old one.

A script that compares checkpoints, a server that swaps the model a request asks for, a notebook
that reloads after an edit: ``model = load(next_name)`` binds the name to the new model only once
it is built, so the old weights stay alive through the whole load (and for good when another name,
a pipeline, an optimizer or an output still refers to the old model). On a device that holds one
model, the second load is the out-of-memory.

What the trace shows. Weights are loaded in *windows*: the weight and buffer blocks made between
two root calls of a model. A window after the run's first root call is a reload. Old weights are
the weight blocks made in earlier windows that are still live when the reload's last weight is
made: the two sets were alive together (``model = load(...)`` frees the old one only when the name
is rebound, after the new one is complete).
A cast done in place (``model.half()``) frees its old weights inside its own window and is not a
switch; weights the run loaded before any call (a pipeline of two models) are not one either.

The fix as a change: the old weights freed where the reload starts (``del model`` and
``gc.collect()``, on a GPU ``torch.cuda.empty_cache()``, before the new ``from_pretrained``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding
from memwarden.analyze.lines import LineBytes, lines_of_rows, merge_lines
from memwarden.analyze.source_lines import call_lines, rebinding_line, script_files
from memwarden.trace.model import Action, Category, Trace
from memwarden.units import format_bytes

PATTERN = "two-models-alive"
_WEIGHTS = np.array([Category.WEIGHT, Category.BUFFER], dtype=np.uint8)


def weight_windows(trace: Trace, device: int, step_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(weight rows, window of each): the window counts the root calls started before the row."""
    e = trace.events
    act = e["action"]
    rows = np.flatnonzero(
        ((act == Action.ALLOC) | (act == Action.MAP) | (act == Action.PREEXISTING))
        & np.isin(e["category"], _WEIGHTS)
        & (e["device"] == device)
    )
    return rows, np.searchsorted(step_starts, e["time_us"][rows], side="right")


def detect(ctx: Context) -> list[Finding]:
    trace = ctx.trace
    min_share = float(ctx.threshold(PATTERN, "min_old_share", 0.25))
    steps = ctx.analysis.steps
    n = trace.num_events
    if not steps or not n:
        return []
    e = trace.events
    starts = np.array([s.start_us for s in steps], dtype=np.int64)
    rows, window = weight_windows(trace, ctx.analysis.device, starts)
    if not len(rows):
        return []
    free = ctx.analysis.free_index
    nbytes = e["nbytes"].astype(np.int64)
    findings = []
    for w in np.unique(window[window > 0]).tolist():
        new = rows[window == w]
        new_bytes = int(nbytes[new].sum())
        first_new, last_new = int(new.min()), int(new.max())
        old = rows[(window < w) & (rows < first_new)]
        old = old[free[old] > last_new]  # still alive when the new model is complete
        old_bytes = int(nbytes[old].sum())
        if not len(old) or old_bytes < min_share * new_bytes or new_bytes < min_share * old_bytes:
            continue
        change = Change(free_rows=old, free_at=np.full(len(old), first_new, dtype=np.int64))
        load_lines = _script_line(lines_of_rows(trace, new, limit=2, callers=False), steps, new_bytes)
        where = f"{load_lines[0].file}:{load_lines[0].line}" if load_lines else "load"
        evidence: dict[str, Any] = {
            "old_weight_bytes": old_bytes,
            "new_weight_bytes": new_bytes,
            "reload_after_calls": int(w),
            "old_freed": bool((free[old] < n).any()),
        }
        fix = (
            f"release the old model before loading the next one ({where}): del model (and every pipeline, "
            f"optimizer or output that refers to it), gc.collect(), on a GPU torch.cuda.empty_cache(), then load; "
            f"{format_bytes(old_bytes)} of old weights are alive beside {format_bytes(new_bytes)} of new ones"
        )
        findings.append(
            Finding(
                pattern=PATTERN,
                severity="high",
                bytes_at_peak=old_bytes,
                wasted_bytes=old_bytes,
                where=where,
                evidence=evidence,
                fix=fix,
                lines=merge_lines(load_lines),
                change=change,
            )
        )
    return findings


def _script_line(made: list[LineBytes], steps: Any, nbytes: int) -> list[LineBytes]:
    """The script's line that binds the new model over the old one first (``self.model = load(name)``):
    from the line that made its weights when it is in the script, else from the script's last call of
    the helper that made them, up through the functions that contain it to the assignment."""
    files = script_files([s.call_site for s in steps if s.call_site])
    if not made:
        return made
    if made[0].file in files or any(f.endswith(made[0].file) for f in files):
        start = [(made[0].file, made[0].line)]
    else:
        start = [(file, c.line) for file in files for c in call_lines(file, made[0].function)[-1:]]
    for file, line in start:
        bound = rebinding_line(file, line)
        at = bound.line if bound is not None else line
        return [LineBytes(file, at, made[0].function, nbytes, 0), *made]
    return made
