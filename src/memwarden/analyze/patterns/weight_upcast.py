"""dequant-temporaries, the float case: a half-precision weight upcast in full on every call.

A model kept in bfloat16 or float16 to halve its weights gives the saving back when a forward
casts a weight to float32 to compute (``F.linear(x.float(), self.weight.float())`` for "stable
log-probabilities", an LM head or a norm written for fp32): each call then makes a float32 copy
of the weight, twice the bytes of the weight it came from, and the largest weight (the tied
vocabulary x hidden embedding) is the one most often treated so. Upcasting the small output
(``F.linear(x, w).float()``) gives the same stability at a fraction of the bytes.

What the trace shows: a floating weight of at most two bytes an element and, made again and
again during the run's calls (inside a module, freed again), blocks of exactly the weight's shape
in a wider float dtype. The join is on the shape, not the module: a tied weight belongs to the
embedding while the head that upcasts it is another module. A weight-shaped activation of a wider
dtype made twice by chance would match too; ``min_blocks`` repeats and the weight's size
(``min_weight_bytes``) keep that rare.

Waste: the copies alive at the trace's peak (the fix makes none).

The kept case (``widened``): the whole half-precision model cast to float32 once and kept so
(``model.to(pixel_values.dtype)`` to reconcile float32 inputs, ``model.float()`` before serving),
which doubles every weight for the rest of the run; casting the inputs to the model's dtype keeps
it. The trace shows most of the half-precision weight bytes freed, each right after a weight of
its shape in a wider float dtype was made. A run with a backward is left out: float32 master
weights for training are a choice, not a slip.
"""

from __future__ import annotations

import bisect

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding, severity_for
from memwarden.analyze.lines import lines_of_rows
from memwarden.trace.model import Action, Category, Phase
from memwarden.units import DTYPE_BYTES, format_bytes

PATTERN = "dequant-temporaries"

_FLOATS = ("float16", "bfloat16", "float32", "float64")


def detect(ctx: Context) -> list[Finding]:
    """The half-precision weights upcast per call, or the model cast wider once and kept so."""
    return _per_call(ctx) or _widened(ctx)


def _per_call(ctx: Context) -> list[Finding]:
    """The half-precision weights whose float32 (or wider) copies each call makes."""
    trace = ctx.trace
    min_blocks = int(ctx.threshold(PATTERN, "min_blocks", 2))
    min_weight_bytes = int(ctx.threshold(PATTERN, "min_weight_bytes", 64 * 1024))
    n = trace.num_events
    if n == 0:
        return []
    ev = trace.events
    strings = trace.strings
    width = np.array([DTYPE_BYTES[s] if s in _FLOATS else 0 for s in strings] + [0], dtype=np.int64)[ev["dtype"]]
    on_dev = ev["device"] == ctx.analysis.device
    action, category = ev["action"], ev["category"]
    is_weight = (category == Category.WEIGHT) | (category == Category.BUFFER)
    is_start = (action == Action.ALLOC) | (action == Action.PREEXISTING) | (action == Action.MAP)
    half = np.flatnonzero(
        is_start & is_weight & on_dev & (width == 2) & (ev["shape"] >= 0) & (ev["nbytes"] >= min_weight_bytes)
    )
    weights: dict[tuple[int, ...], int] = {}  # shape -> the largest half-precision weight of it
    for r in half[np.argsort(-ev["nbytes"][half], kind="stable")].tolist():
        shape = tuple(trace.shape(int(ev["shape"][r])) or ())
        if len(shape) >= 2:
            weights.setdefault(shape, r)
    if not weights:
        return []
    fidx = ctx.analysis.free_index
    made = np.flatnonzero(
        (action == Action.ALLOC)
        & on_dev
        & ~is_weight
        & (width > 2)
        & (ev["module"] >= 0)
        & (ev["shape"] >= 0)
        & (ev["nbytes"] >= 2 * min_weight_bytes)
    )
    made = made[fidx[made] < n]  # freed again: a per-call copy, not a float model kept
    copies: dict[int, list[int]] = {}  # weight row -> its copies
    for r in made.tolist():
        w = weights.get(tuple(trace.shape(int(ev["shape"][r])) or ()))
        if w is not None:
            copies.setdefault(w, []).append(r)
    copies = {w: rows for w, rows in copies.items() if len(rows) >= min_blocks}
    if not copies:
        return []
    rows = np.sort(np.concatenate([np.array(c, dtype=np.int64) for c in copies.values()]))
    live = ctx.analysis.live_bytes
    peak_row = int(np.argmax(live))
    peak_bytes = int(live[peak_row])
    at_peak = (rows <= peak_row) & (fidx[rows] > peak_row)
    nbytes = ev["nbytes"][rows]
    wasted = int(nbytes[at_peak].sum())
    allocated = int(nbytes.sum())
    worst = max(copies, key=lambda w: (int(ev["nbytes"][np.array(copies[w])].sum()), -w))
    w_dtype, c_dtype = trace.string(int(ev["dtype"][worst])), trace.string(int(ev["dtype"][copies[worst][0]]))
    w_shape = list(trace.shape(int(ev["shape"][worst])) or ())
    module = (trace.string(int(ev["module"][worst])) if ev["module"][worst] >= 0 else None) or "?"
    caller = trace.string(int(ev["module"][copies[worst][0]])) or module  # the module whose call upcasts
    # the line that casts (inside the forward that upcasts), then the call that ran it
    inner = lines_of_rows(trace, np.array(copies[worst]), 1, callers=False)
    outer = lines_of_rows(trace, np.array(copies[worst]), 1, callers=True)
    lines = [{"file": x.file, "line": x.line, "nbytes": x.nbytes} for x in dict.fromkeys([*inner, *outer])]
    evidence = {
        "bytes_at_peak": wasted,
        "copies": len(rows),
        "bytes_allocated": allocated,
        "peak_bytes": peak_bytes,
        "weights": [
            {
                "module": trace.string(int(ev["module"][w])) if ev["module"][w] >= 0 else None,
                "dtype": trace.string(int(ev["dtype"][w])),
                "shape": list(trace.shape(int(ev["shape"][w])) or ()),
                "weight_bytes": int(ev["nbytes"][w]),
                "copies": len(c),
                "copy_dtype": trace.string(int(ev["dtype"][c[0]])),
                "called_from": trace.string(int(ev["module"][c[0]])),
            }
            for w, c in sorted(copies.items(), key=lambda kv: -len(kv[1]))[:8]
        ],
    }
    fix = (
        f"the {w_dtype} weight {w_shape} of {module} is upcast to {c_dtype} on every call ({len(rows)} copies of "
        f"{format_bytes(int(ev['nbytes'][copies[worst][0]]))}): keep the weight in {w_dtype} and upcast the output "
        f"instead (F.linear(x, weight).float(), or logits.float() after the head), or compute in {w_dtype} with "
        f"out_dtype=torch.float32: saves {format_bytes(wasted)} at the peak ({format_bytes(allocated)} allocated)"
    )
    return [
        Finding(
            pattern=PATTERN,
            severity=severity_for(wasted, peak_bytes),
            bytes_at_peak=wasted,
            wasted_bytes=wasted,
            where=caller,
            evidence=evidence,
            fix=fix,
            change=Change(drop=rows),
            lines=lines,
        )
    ]


def _widened(ctx: Context) -> list[Finding]:
    """Half-precision weights replaced by float32 (or wider) copies of their shape, kept as weights."""
    trace = ctx.trace
    min_share = float(ctx.threshold(PATTERN, "min_widened_share", 0.5))
    n = trace.num_events
    ev = trace.events
    on_dev = ev["device"] == ctx.analysis.device
    if n == 0 or bool(np.any((ev["phase"] == Phase.BACKWARD) & on_dev)):
        return []
    width = np.array([DTYPE_BYTES[s] if s in _FLOATS else 0 for s in trace.strings] + [0], dtype=np.int64)[ev["dtype"]]
    action, category = ev["action"], ev["category"]
    is_weight = (category == Category.WEIGHT) | (category == Category.BUFFER)
    has_shape = on_dev & (ev["shape"] >= 0)
    fidx = ctx.analysis.free_index
    wide = np.flatnonzero((action == Action.ALLOC) & is_weight & has_shape & (width > 2))
    # The half-precision weights a cast replaced died before the capture saw them called as weights,
    # so a block of any kind but an input qualifies, by its shape and its death after its copy.
    is_start = (action == Action.ALLOC) | (action == Action.PREEXISTING) | (action == Action.MAP)
    narrow = np.flatnonzero(
        is_start
        & has_shape
        & (width == 2)
        & (is_weight | (category == Category.OTHER))
        & np.isin(ev["shape"], ev["shape"][wide])
    )
    if not len(narrow) or not len(wide):
        return []
    by_shape: dict[int, list[int]] = {}
    for r in narrow.tolist():
        by_shape.setdefault(int(ev["shape"][r]), []).append(r)
    pairs: list[tuple[int, int]] = []  # (narrow row, the wide row that replaced it)
    taken: set[int] = set()
    for w in wide.tolist():
        # the half-precision block of its shape alive when it was made and freed first after it
        made = by_shape.get(int(ev["shape"][w]), [])
        alive = [r for r in made[: bisect.bisect_left(made, w)] if w <= fidx[r] and r not in taken]
        if alive:
            r = min(alive, key=lambda r: (int(fidx[r]), -r))
            pairs.append((r, w))
            taken.add(r)
    wide_bytes = int(ev["nbytes"][wide].sum())
    if not pairs or int(ev["nbytes"][[w for _, w in pairs]].sum()) < min_share * wide_bytes:
        return []
    replaced = np.array([r for r, _ in pairs], dtype=np.int64)
    rows = np.array([w for _, w in pairs], dtype=np.int64)
    scale = ev["nbytes"][replaced] / ev["nbytes"][rows]
    # The model's calls after the cast compute in the wide dtype too: their float activations,
    # caches and temporaries of that width shrink with the weights (the inputs cast instead).
    wide_width = int(width[rows[0]])
    working = np.isin(category, [Category.ACTIVATION, Category.KV_CACHE, Category.TEMPORARY])
    after = np.flatnonzero((action == Action.ALLOC) & working & on_dev & (ev["module"] >= 0) & (width == wide_width))
    after = after[after > rows.min()]
    scaled = np.concatenate([rows, after])
    factor = np.concatenate([scale, np.full(len(after), 2 / wide_width)])
    # each half-precision weight gives way to its (scaled) copy when the copy is made: one weight set
    change = Change(
        scale_rows=scaled, scale=factor.astype(np.float64), free_rows=replaced, free_at=rows.astype(np.int64)
    )
    live = ctx.analysis.live_bytes
    peak_row = int(np.argmax(live))
    peak_bytes = int(live[peak_row])
    at_peak = (scaled <= peak_row) & (fidx[scaled] > peak_row)
    wasted = int((ev["nbytes"][scaled][at_peak] * (1 - factor[at_peak])).sum())
    if wasted <= 0:
        return []
    lines = [{"file": x.file, "line": x.line, "nbytes": x.nbytes} for x in lines_of_rows(trace, rows, 2)]
    narrow_dtype = trace.string(int(ev["dtype"][replaced[0]]))
    wide_dtype = trace.string(int(ev["dtype"][rows[0]]))
    evidence = {
        "weights_widened": len(rows),
        "weight_bytes_before": int(ev["nbytes"][replaced].sum()),
        "weight_bytes_after": int(ev["nbytes"][rows].sum()),
        "from_dtype": narrow_dtype,
        "to_dtype": wide_dtype,
        "bytes_at_peak": wasted,
        "peak_bytes": peak_bytes,
    }
    fix = (
        f"the {narrow_dtype} model is cast to {wide_dtype} and kept so ({len(rows)} weights, "
        f"{format_bytes(int(ev['nbytes'][replaced].sum()))} -> {format_bytes(int(ev['nbytes'][rows].sum()))}): "
        f"keep the weights in {narrow_dtype} and cast the inputs to the model's dtype instead "
        f"(pixel_values.to(model.dtype), inputs.to(model.device, model.dtype)); saves {format_bytes(wasted)} "
        f"at the peak"
    )
    return [
        Finding(
            pattern=PATTERN,
            severity=severity_for(wasted, peak_bytes),
            bytes_at_peak=wasted,
            wasted_bytes=wasted,
            where="model weights",
            evidence=evidence,
            fix=fix,
            change=change,
            lines=lines,
        )
    ]
