"""graph-retention: autograd graphs of several root forward calls alive together.

Training code keeps a graph alive when a tensor that requires grad outlives
the step that made it: losses of micro-batches summed before one backward,
losses appended to a list (for logging) without ``.item()`` / ``.detach()``,
an evaluation loop without ``torch.no_grad()``. Each such graph holds every
activation its forward saved for backward.

What the trace shows: every root model call is a STEP span. For step ``j`` let
``S_j`` be the bytes of the activation blocks it made that are still live when
it returns (saved tensors plus outputs). Its graph counts as *alive* at the
start of a later step of the same root module while at least
``retained_fraction`` of ``S_j`` is still live. A step's graph that is freed
by its backward (or, under no_grad, that never existed) is gone by then; an
output that a loop keeps (``out = model(x)`` reassigned next iteration) is a
small share of ``S_j`` when autograd saved tensors, and is not counted.

Autograd must be visible: the trace has backward-phase allocations, or the
retained blocks come from at least ``min_modules_without_backward`` modules
(an evaluation loop that never calls backward). Kept outputs of a no_grad
loop come from one or two modules and are not called graphs.

Waste: at the trace's peak, the live activation bytes of every alive graph
except the newest one (the graph the current step needs anyway).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.counterfactual import saving as replay_saving
from memwarden.analyze.finding import Context, Finding, severity_for
from memwarden.analyze.lines import LineBytes, finding_lines, holder_line, merge_lines
from memwarden.analyze.source_lines import handler_line, holding_line, keeper_line, script_files
from memwarden.analyze.timeline import live_blocks_at
from memwarden.trace.model import Action, Category, Phase, SpanKind, Trace
from memwarden.trace.sites import parse_line
from memwarden.trace.steps import Step
from memwarden.units import format_bytes

PATTERN = "graph-retention"
_EVIDENCE_STEPS = 64
_SCALAR_BYTES = (
    16  # a kept 0-d tensor (a loss) is at most this big  # per-step lists in the evidence are cut to this many entries
)


def _step_table(trace: Trace, steps: Sequence[Step]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(start_us, end_us, group id, group names) of the root calls, in start order.

    Steps of different root modules (a model run as two separately called
    halves) never count as each other's extra graphs, so they are grouped by
    the root module named in the trace's ``steps`` when they line up with the spans.
    """
    kind = trace.spans["kind"]
    rows = np.flatnonzero(kind == SpanKind.STEP)
    starts = trace.spans["start_us"][rows]
    order = np.argsort(starts, kind="stable")
    rows = rows[order]
    starts, ends = trace.spans["start_us"][rows], trace.spans["end_us"][rows]
    names = ["model"] * len(rows)
    if len(steps) == len(rows):
        names = [st.module for st in steps]  # both in start order
    uniq = sorted(set(names))
    group = np.array([uniq.index(n) for n in names], dtype=np.int64)
    return starts.astype(np.int64), ends.astype(np.int64), group, uniq


def _alive_at(starts: np.ndarray, alive_until: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Graphs alive at the start of each step: its own, plus earlier steps of the same root module
    whose graph outlives that start. Each graph j covers the steps (j, k_end_j): a difference array."""
    alive_at = np.ones(len(starts), dtype=np.int64)  # the current step's own graph
    for g in range(n_groups):
        idx = np.flatnonzero(group == g)
        if len(idx) < 2:
            continue
        k_end = np.searchsorted(starts[idx], alive_until[idx], side="left")  # first step starting at/after it
        k_begin = np.arange(len(idx)) + 1
        cover = k_end > k_begin
        diff = np.zeros(len(idx) + 1, dtype=np.int64)
        np.add.at(diff, k_begin[cover], 1)
        np.add.at(diff, k_end[cover], -1)
        alive_at[idx] += np.cumsum(diff)[:-1]
    return alive_at


def detect(ctx: Context) -> list[Finding]:
    trace = ctx.trace
    fraction = float(ctx.threshold(PATTERN, "retained_fraction", 0.5))
    min_graphs = int(ctx.threshold(PATTERN, "min_graphs_alive", 2))
    min_modules = int(ctx.threshold(PATTERN, "min_modules_without_backward", 3))
    starts, ends, group, group_names = _step_table(trace, ctx.analysis.steps)
    n = trace.num_events
    if len(starts) < 2 or n == 0:
        return []
    ev = trace.events
    dev = ctx.analysis.device
    on_dev = ev["device"] == dev
    times = ev["time_us"]

    # Activation blocks made inside a step, with the time they are freed.
    act_rows = np.flatnonzero((ev["action"] == Action.ALLOC) & (ev["category"] == Category.ACTIVATION) & on_dev)
    if len(act_rows) == 0:
        return []
    t_alloc = times[act_rows]
    step = np.searchsorted(starts, t_alloc, side="right") - 1
    inside = step >= 0
    inside[inside] &= t_alloc[inside] <= ends[step[inside]]
    act_rows, step, t_alloc = act_rows[inside], step[inside], t_alloc[inside]
    if len(act_rows) == 0:
        return []
    fidx = ctx.analysis.free_index[act_rows]
    never = np.iinfo(np.int64).max
    t_free = np.where(fidx < n, times[np.minimum(fidx, n - 1)], never)
    nbytes = ev["nbytes"][act_rows]

    # S_j: bytes still live when step j returns.
    at_end = t_free > ends[step]
    n_steps = len(starts)
    saved = np.bincount(step[at_end], weights=nbytes[at_end], minlength=n_steps)

    # alive_until_j: the graph counts as alive while >= fraction * S_j of it is live.
    # Sort its surviving blocks by free time, latest first; the free time at which the
    # running total first reaches fraction * S_j is when it stops counting.
    rows_s, step_s, free_s, bytes_s = act_rows[at_end], step[at_end], t_free[at_end], nbytes[at_end]
    order = np.lexsort((-free_s, step_s))
    step_s, free_s, bytes_s, rows_s = step_s[order], free_s[order], bytes_s[order], rows_s[order]
    cum = np.cumsum(bytes_s)
    first = np.searchsorted(step_s, np.arange(n_steps), side="left")
    base = np.where(first > 0, cum[np.maximum(first - 1, 0)], 0)
    alive_until = np.full(n_steps, -1, dtype=np.int64)
    has = saved > 0
    target = base[has] + np.ceil(fraction * saved[has])
    pos = np.minimum(np.searchsorted(cum, target, side="left"), len(cum) - 1)
    alive_until[has] = free_s[pos]

    # Graphs alive at the start of each step: earlier steps of the same root module whose
    # graph outlives that start. Each graph j covers the steps (j, k_end_j): a difference array.
    alive_at = _alive_at(starts, alive_until, group, len(group_names))
    most = int(alive_at.max())
    if most < min_graphs:
        return []

    # Was autograd at work? Where the capture recorded grad mode per step, a graph needs a step
    # that ran with autograd on: outputs kept from no_grad/inference_mode calls (a LLaVA output, a
    # generation loop's KV tuple) hold no graph. Older traces: backward allocations, or retention
    # spread over many modules.
    retaining = np.flatnonzero(alive_until > np.concatenate([starts[1:], [never]]))  # steps kept past the next start
    grad = ctx.analysis.step_grad
    if len(grad) == n_steps and all(g is not None for g in grad):
        recording = np.array(grad, dtype=bool)
        if not recording[retaining].any():
            return []
        alive_until = np.where(recording, alive_until, -1)
        alive_at = _alive_at(starts, alive_until, group, len(group_names))
        most = int(alive_at.max())
        if most < min_graphs:
            return []
    has_backward = bool(np.any((ev["phase"] == Phase.BACKWARD) & on_dev))
    if not has_backward:
        kept = np.isin(step_s, retaining) & (free_s >= alive_until[step_s])
        if len(np.unique(ev["module"][rows_s[kept]])) < min_modules:
            return []

    # Waste at the peak: live activations of alive graphs other than the newest one.
    live = ctx.analysis.live_bytes
    peak_row = int(np.argmax(live))
    peak_bytes = int(live[peak_row])
    t_peak = int(times[peak_row])
    live_at_peak = (act_rows <= peak_row) & (fidx > peak_row)
    per_step_at_peak = np.bincount(step[live_at_peak], weights=nbytes[live_at_peak], minlength=n_steps)
    alive_graph = (alive_until > t_peak) & (per_step_at_peak > 0) & (starts <= t_peak)
    graphs_at_peak = np.flatnonzero(alive_graph)
    wasted = 0
    for g in np.unique(group[graphs_at_peak]):
        members = graphs_at_peak[group[graphs_at_peak] == g]
        wasted += int(per_step_at_peak[members[:-1]].sum())  # all but the newest of that root module
    if wasted <= 0:
        return []

    # Evidence: activation bytes live at each step's start, and their growth per step.
    act_signed = np.where(on_dev & (ev["category"] == Category.ACTIVATION), trace.signed_bytes(), 0)
    act_live = np.cumsum(act_signed)
    before = np.searchsorted(times, starts, side="left") - 1
    live_at_start = np.where(before >= 0, act_live[np.maximum(before, 0)], 0)
    growth = float(np.polyfit(np.arange(n_steps), live_at_start.astype(np.float64), 1)[0]) if n_steps >= 2 else 0.0
    worst = int(np.argmax(alive_at))
    root = group_names[int(group[worst])]
    evidence = {
        "graphs_alive_together": most,
        "graphs_alive_at_peak": len(graphs_at_peak),
        "extra_graph_bytes_at_peak": wasted,
        "growth_bytes_per_step": int(round(growth)),
        "steps": n_steps,
        "activation_bytes_at_step_start": [int(v) for v in live_at_start[:_EVIDENCE_STEPS]],
        "graphs_alive_at_step_start": [int(v) for v in alive_at[:_EVIDENCE_STEPS]],
        "saved_bytes_per_step": [int(v) for v in saved[:_EVIDENCE_STEPS]],
        "peak_bytes": peak_bytes,
        "backward_seen": has_backward,
        "retained_fraction": fraction,
    }
    # How the extra graphs die tells the two mistakes apart: a backward that frees several
    # graphs at once (losses summed over micro-batches), or no backward at all (losses kept
    # for logging, evaluation without no_grad).
    backward_t = np.sort(times[(ev["action"] == Action.ALLOC) & (ev["phase"] == Phase.BACKWARD) & on_dev])
    extra = graphs_at_peak[:-1]
    after_end = np.searchsorted(backward_t, ends[extra], side="right")
    by_backward = after_end < np.searchsorted(backward_t, alive_until[extra], side="right")
    summed = bool(len(extra)) and bool(by_backward.all())
    evidence["freed_by_one_backward"] = summed
    saving = f"saves {format_bytes(wasted)} at the peak ({len(graphs_at_peak) - 1} extra graph(s))"
    if summed:
        fix = (
            f"call backward per micro-batch, (loss / n).backward(), instead of summing the losses of several "
            f"root calls before one backward (gradient accumulation gives the same gradients); log loss.item(): "
            f"{saving}"
        )
    else:
        fix = (
            f"do not keep tensors that require grad across steps: log loss.item() / loss.detach() instead of the "
            f"loss tensor, run evaluation under torch.no_grad(), and with gradient accumulation call "
            f"(loss / n).backward() per micro-batch: {saving}"
        )
    severity = severity_for(wasted, peak_bytes)
    if most < 3:
        # One previous graph, not a growing chain: a local (loss, output) still bound to the last
        # step's graph while the next forward runs. Real, bounded, and the usual loop shape.
        severity = "low"
        fix = (
            f"the previous step's graph is still referenced (by a local such as loss or output) while the "
            f"next forward runs: del those locals at the end of the step or run the step in a function; "
            f"{saving}"
        )
    # The fix as a change: every graph kept past its step (by a loss summed, a list, a loop without
    # no_grad) is freed when its step returns, as backward per micro-batch or no_grad would free it.
    # The fix as a change, the smallest of the fixes named: .item() / backward per micro-batch frees
    # each graph when its step returns. Without any backward, no_grad would also drop what the
    # current step saves (its blocks kept to its end, the output aside, freed once used): that
    # larger saving is evidence, not the headline.
    kept_past = np.flatnonzero(alive_until > np.concatenate([starts[1:], [never]]))  # recording steps only
    kept_rows = np.isin(step, kept_past) & at_end
    free_at = np.searchsorted(times, ends[step[kept_rows]], side="right")
    if not has_backward:
        rec = np.array([g is not False for g in grad], dtype=bool) if len(grad) == n_steps else np.ones(n_steps, bool)
        last_of_step = np.zeros(len(act_rows), dtype=bool)
        last_of_step[np.maximum(np.searchsorted(step, np.arange(n_steps), side="right") - 1, 0)] = True
        nograd = rec[step] & at_end & ~last_of_step
        no_grad = replay_saving(ctx.analysis, Change(free_rows=act_rows[nograd], free_at=act_rows[nograd] + 1))
        evidence["saving_peak_bytes_with_no_grad"] = no_grad.saving_peak_bytes
    change = Change(free_rows=act_rows[kept_rows], free_at=free_at)
    return [
        Finding(
            pattern=PATTERN,
            severity=severity,
            change=change,
            bytes_at_peak=int(per_step_at_peak[graphs_at_peak].sum()),
            wasted_bytes=wasted,
            where=root,
            evidence=evidence,
            fix=fix,
            lines=_lines(trace, ctx, peak_row, root, starts, ends, group, graphs_at_peak, has_backward),
        )
    ]


def _lines(
    trace: Trace,
    ctx: Context,
    peak_row: int,
    root: str,
    starts: np.ndarray,
    ends: np.ndarray,
    group: np.ndarray,
    graphs_at_peak: np.ndarray,
    has_backward: bool,
) -> list[dict[str, object]]:
    """The line that keeps the oldest extra graph first (what the script made between that step
    and the next one of its root module, still live at the peak: ``total_loss += loss``), then the
    lines the graphs' activations came from (the calls' lines). Without any backward, a kept result
    larger than a scalar (features, predictions; a kept loss is a scalar, fixed by ``.item()`` where it
    is kept) is fixed by ``no_grad`` around the call: the call's own line (the step's caller) comes first."""
    live = live_blocks_at(trace, peak_row, ctx.analysis.device, ctx.analysis.free_index)
    calls = finding_lines(trace, root, live, pattern=PATTERN)
    if len(graphs_at_peak) < 2:
        return calls
    oldest = int(graphs_at_peak[0])
    later = np.flatnonzero((group == group[oldest]) & (starts > starts[oldest]))
    until = int(starts[later[0]]) if len(later) else int(trace.events["time_us"][peak_row])
    site = next((s.call_site for s in ctx.analysis.steps if s.start_us == int(starts[oldest])), None)
    holder = holder_line(trace, int(ends[oldest]) + 1, until - 1, live, site)
    if holder is not None:  # ``loss = out.loss / n`` is what lives; ``total = total + loss`` keeps it
        keeper = keeper_line(holder.file, holder.line)
        if keeper is None:  # made in a helper that returns it (``return F.cross_entropy(...)``): its caller keeps it
            scripts = script_files([s.call_site or "" for s in ctx.analysis.steps]) or [holder.file]
            keeper = holding_line(holder.file, holder.line, holder.function, scripts)
        if keeper is not None:
            holder = LineBytes(keeper.file, keeper.line, holder.function, holder.nbytes, holder.count)
    first = [holder] if holder is not None else []
    kept_result = holder is None or holder.nbytes > _SCALAR_BYTES  # not a logged loss (.item() fixes that)
    if not has_backward and site is not None and kept_result:
        call = parse_line(site)
        # A handler called once per request (no loop of its own around the call) forgot no_grad at
        # its def (`@torch.no_grad()` goes there); a call in a loop, at the call.
        handler = handler_line(call.file, call.line)
        at = handler.line if handler is not None else call.line
        first = [LineBytes(call.file, at, call.function, 0, 0), *first]
    if not first:
        return calls
    return merge_lines(first, [_as_line(x) for x in calls])


def _as_line(x: dict[str, object]) -> LineBytes:
    return LineBytes(str(x["file"]), int(x["line"]), "", int(x["nbytes"]), 0)  # type: ignore[call-overload]
