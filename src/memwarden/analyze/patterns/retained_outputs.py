"""retained-outputs: what each iteration produced, kept across iterations with what it carries.

The commonest leak in inference code: a loop keeps every ``generate(..., return_dict_in_generate=
True, output_hidden_states=True)`` result in a list (and with it every step's hidden states,
attentions, scores and the whole KV cache), a chat loop keeps every turn's output object and so
every turn's cache, an evaluation loop keeps each batch's logits (``preds.append(out.logits)``,
``all_logits = torch.cat([all_logits, logits])``). Nothing is wrong inside one iteration; the peak
grows with the number of iterations.

What the trace shows. An *iteration* is one request: a run of root calls that starts with a call
that is not a decode step (a prefill, a forward), with its decode steps; the allocations a loop
makes between two requests belong to the one before. A block is *kept* when it is still live when
the request after next starts: ``out = model.generate(...)`` reassigned next time frees the old
result once the new call has returned, but a list that keeps it does not. The pattern holds when, at the
peak, blocks kept from at least ``min_iterations`` (2) earlier iterations are still live (weights,
buffers, gradients and optimizer state are meant to stay and are left out; graphs of calls made
with autograd on are graph-retention's).

The fix as a change: every kept block is freed when the request after next starts (what
reassigning ``out``, keeping ``.sequences``/``.item()``/``.cpu()`` of what is needed, or deleting
``past_key_values``/``hidden_states`` does). The line to change is the statement that keeps the
result, followed from the call in the script's own source (``analyze/source_lines.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding, severity_for
from memwarden.analyze.lines import LineBytes, finding_lines, merge_lines, row_lines
from memwarden.analyze.patterns.unbounded_growth import bounded_window
from memwarden.analyze.source_lines import keeper_line
from memwarden.analyze.timeline import live_blocks_at
from memwarden.analyze.window_read import Window, window_read
from memwarden.trace.model import Action, Category, Trace, enum_name
from memwarden.trace.sites import parse_line
from memwarden.trace.steps import Step
from memwarden.units import format_bytes

PATTERN = "retained-outputs"
_STAY = np.array([Category.WEIGHT, Category.BUFFER, Category.GRADIENT, Category.OPTIMIZER_STATE], dtype=np.uint8)


def iterations(steps: tuple[Step, ...] | list[Step]) -> list[list[Step]]:
    """The steps grouped into requests: a new one at every step that is not a decode step."""
    groups: list[list[Step]] = []
    for st in steps:
        if st.phase != "decode" or not groups:
            groups.append([st])
        else:
            groups[-1].append(st)
    return groups


def detect(ctx: Context) -> list[Finding]:
    trace = ctx.trace
    min_iterations = int(ctx.threshold(PATTERN, "min_iterations", 2))
    steps = ctx.analysis.steps
    groups = iterations(steps)
    n = trace.num_events
    if len(groups) < min_iterations + 1 or not n:
        return []
    e = trace.events
    times = e["time_us"]
    starts = np.array([g[0].start_us for g in groups], dtype=np.int64)
    grad = np.array([any(bool(s.grad) for s in g) for g in groups], dtype=bool)
    rows = np.flatnonzero((e["action"] == Action.ALLOC) & (e["device"] == ctx.analysis.device))
    rows = rows[~np.isin(e["category"][rows], _STAY) & (times[rows] >= starts[0])]
    if not len(rows):
        return []
    it = np.searchsorted(starts, times[rows], side="right") - 1  # the request a block belongs to
    # ``out = model.generate(...)`` in a loop frees the old result only once the new call has returned
    # (its last step is not yet the return: the output is assembled after it), so a result is *kept*
    # when it is still live when the request after next starts. The change frees it there.
    after_next = it + 2
    has_after = after_next < len(groups)
    rows, it, after_next = rows[has_after], it[has_after], after_next[has_after]
    free = ctx.analysis.free_index[rows]
    end_next_row = np.searchsorted(times, starts[after_next], side="left")
    kept = (free > end_next_row) & ~grad[it]  # outlives the next request; graphs are graph-retention's
    rows, it, end_next_row, free = rows[kept], it[kept], end_next_row[kept], free[kept]
    if not len(rows):
        return []
    live = ctx.analysis.live_bytes
    peak_row = int(np.argmax(live))
    peak_it = int(np.searchsorted(starts, times[peak_row], side="right") - 1)
    at_peak = (rows <= peak_row) & (free > peak_row) & (it < peak_it)
    nbytes = e["nbytes"][rows]
    per_iteration = np.bincount(it[at_peak], weights=nbytes[at_peak], minlength=len(groups))
    top = int(np.argmax(per_iteration))
    if per_iteration[top] * 2 > per_iteration.sum():
        # One request's blocks are most of what is kept: made once and meant to stay (a buffer or a
        # cross-attention cache made before a decode loop), not a result kept per request; what the
        # other requests keep decides.
        keep = it != top
        rows, it, end_next_row, free, at_peak, nbytes = (
            rows[keep],
            it[keep],
            end_next_row[keep],
            free[keep],
            at_peak[keep],
            nbytes[keep],
        )
        per_iteration[top] = 0
    kept_iterations = np.unique(it[at_peak])
    if len(kept_iterations) < min_iterations or _evicting(trace, free, starts):
        return []
    kept_at_peak = int(nbytes[at_peak].sum())
    by_category: dict[str, int] = {}
    for cat in np.unique(e["category"][rows[at_peak]]).tolist():
        sel = at_peak & (e["category"][rows] == cat)
        by_category[enum_name(Category(cat))] = int(nbytes[sel].sum())
    change = Change(free_rows=rows, free_at=end_next_row)
    lines, keeper = _lines(trace, ctx, rows[at_peak], groups, peak_row)
    window = _window(trace, rows[at_peak], keeper)
    if window is not None:  # every item is needed, but only the newest few: a bound, not less per item
        return [bounded_window(trace, window, rows, it, starts, lines, kept_at_peak, len(kept_iterations))]
    carried = ", ".join(f"{k} {format_bytes(v)}" for k, v in sorted(by_category.items(), key=lambda kv: -kv[1]))
    at = f" at {keeper['file']}:{keeper['line']}" if keeper else ""
    what = (
        "reduce each batch's logits to what you read before keeping them: the predictions (logits.argmax(-1)) "
        "or the metric's inputs (transformers' preprocess_logits_for_metrics); "
        if _mostly_logits(trace, rows[at_peak])
        else ""
    )
    if not what and not any(st.phase == "decode" for g in groups for st in g):  # an encoder's outputs
        what = (
            "keep the pooled embedding (out.pooler_output / image_embeds) or the one hidden state you read, not "
            "the whole output with every layer's hidden_states; "
        )
    fix = (
        f"{what}keep only what you need from each result{at}: the generated ids (out.sequences), a number (.item()) or "
        f"a small .detach().cpu() slice, not the whole output with its caches, hidden states and attentions; call "
        f"generate without output_hidden_states/output_attentions/return_dict_in_generate when you do not read "
        f"them, and del past_key_values of finished requests. {len(kept_iterations)} earlier requests' outputs "
        f"({carried}) are alive at the peak"
    )
    evidence: dict[str, Any] = {
        "iterations": len(groups),
        "iterations_kept_at_peak": len(kept_iterations),
        "kept_bytes_at_peak": kept_at_peak,
        "kept_bytes_by_category": by_category,
        "kept_bytes_per_iteration": [int(v) for v in per_iteration[:64]],
        "keeper": keeper or {},
    }
    return [
        Finding(
            pattern=PATTERN,
            severity=severity_for(kept_at_peak, int(live[peak_row])),
            bytes_at_peak=kept_at_peak,
            wasted_bytes=kept_at_peak,
            where=groups[0][0].module,
            evidence=evidence,
            fix=fix,
            lines=lines,
            change=change,
        )
    ]


def _evicting(trace: Trace, free: np.ndarray, starts: np.ndarray) -> bool:
    """The kept results are a bounded cache's: once it filled, most requests free an older one
    (an ``lru_cache(maxsize=32)``, a deque with a maxlen), so what is kept stays as large as the
    bound, not growing with the requests. A list cleared now and then frees them in a few requests."""
    n = trace.num_events
    freed = free[free < n]
    if not len(freed):
        return False
    when = np.searchsorted(starts, trace.events["time_us"][freed], side="right") - 1
    during = np.unique(when[when < len(starts) - 1])  # freed while the loop still had requests to run
    return len(during) >= 4 and len(during) >= 0.5 * (len(starts) - 1 - int(during.min()))


def _window(trace: Trace, kept: np.ndarray, keeper: dict[str, Any] | None) -> Window | None:
    """The window the script reads of the container that keeps the results, if it reads one."""
    spots = [(str(keeper["file"]), int(keeper["line"]))] if keeper else []
    for x in row_lines(trace, kept):
        found = keeper_line(x[0], x[1]) if x is not None else None
        if found is not None:
            spots.append((found.file, found.line))
    for file, line in dict.fromkeys(spots):
        window = window_read(file, line)
        if window is not None:
            return window
    return None


def _mostly_logits(trace: Trace, kept: np.ndarray) -> bool:
    """Whether most kept bytes are logits: made by the language-model head (``lm_head``), the full
    vocabulary per position of each kept output."""
    e = trace.events
    head = np.array([s.rsplit(".", 1)[-1] == "lm_head" or s.endswith(".lm_head") for s in trace.strings] + [False])
    modules = e["module"][kept]
    in_head = head[np.where(modules >= 0, modules, len(trace.strings))]
    return int(e["nbytes"][kept][in_head].sum()) * 2 > int(e["nbytes"][kept].sum())


def _lines(
    trace: Trace, ctx: Context, kept: np.ndarray, groups: list[list[Step]], peak_row: int
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The statement that keeps the results first (followed from the call in the script's source:
    the ``append``, the dict insert, the ``cat`` accumulator), then the lines that made them."""
    e = trace.events
    sites = [s.call_site for g in groups for s in g if s.call_site]
    made = row_lines(trace, kept)
    candidates: list[tuple[str, int]] = []
    for site in dict.fromkeys(sites):
        src = parse_line(site)
        candidates.append((src.file, src.line))
    for x in made:
        if x is not None and (x[0], x[1]) not in candidates:
            candidates.append((x[0], x[1]))
    found = next((k for k in (keeper_line(f, ln) for f, ln in candidates) if k is not None), None)
    keeper = {"file": found.file, "line": found.line, "what": found.what} if found else None
    first = [LineBytes(found.file, found.line, "", int(e["nbytes"][kept].sum()), len(kept))] if found else []
    live = live_blocks_at(trace, peak_row, ctx.analysis.device, ctx.analysis.free_index)
    rest = [
        LineBytes(str(x["file"]), int(x["line"]), "", int(x["nbytes"]), 0)
        for x in finding_lines(trace, groups[0][0].module, live, pattern=PATTERN)
    ]
    return merge_lines(first, rest), keeper
