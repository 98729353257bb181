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
"""

from __future__ import annotations

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding, severity_for
from memwarden.analyze.lines import lines_of_rows
from memwarden.trace.model import Action, Category
from memwarden.units import DTYPE_BYTES, format_bytes

PATTERN = "dequant-temporaries"

_FLOATS = ("float16", "bfloat16", "float32", "float64")


def detect(ctx: Context) -> list[Finding]:
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
