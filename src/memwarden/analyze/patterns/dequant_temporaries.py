"""dequant-temporaries: quantised weights dequantised in full, per call.

A weight-only quantised model saves memory only if its weights stay
quantised while it computes. A hand-written ``forward`` that unpacks and
converts the whole weight (``w.to(x.dtype) * scale``, nibble unpacking
followed by ``.float()``) makes one or more full-size float copies of the
weight on every call: the peak then holds the largest layer two to three
times in float, often more than the quantised model itself.

What the trace shows: an integer (or float8) weight or buffer -- int8/uint8,
int4 packed two per byte, int32 packing eight -- and, inside the module that
owns it, short-lived blocks with as many elements as the weight holds values
(1x, 2x for int4 in bytes, 8x for int4 in int32), made again and again. The
float ones are the dequantised copies; integer ones of the same size are the
unpacked nibbles on the way there. "Short-lived": freed before the root call
(step) that made them returns, or freed at all when the trace has no steps.

Matching is by (owning module, element count), a dictionary join: no data
flow is recorded, so a module that legitimately makes weight-sized tensors
from something else would match too; ``min_blocks`` repeats are required.

Copies saved for backward (``F.linear(x, W.to(dtype) * scale)`` with ``x``
requiring grad) outlive their step and die in the backward pass that follows;
they are kept as candidates too, and the fix then names a custom
``torch.autograd.Function`` that saves only the quantised weight.

Waste: the matched blocks live at the trace's peak (what a fused kernel, which
dequantises tiles in registers, never allocates).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding, severity_for
from memwarden.analyze.lines import lines_of_rows
from memwarden.analyze.patterns import weight_upcast
from memwarden.analyze.source_lines import holding_line, script_files
from memwarden.trace.model import Action, Category, Phase, SpanKind, Trace
from memwarden.units import DTYPE_BYTES, format_bytes

PATTERN = "dequant-temporaries"

# Quantised storage dtypes -> how many weight values one stored element holds (the
# multiples a dequantised copy's element count may have). int8/uint8 hold one value,
# or two int4 nibbles; int32 holds one int8-in-int32 value or eight nibbles (GPTQ).
_QUANT_FACTORS: dict[str, tuple[int, ...]] = {
    "int8": (1, 2),
    "uint8": (1, 2),
    "qint8": (1,),
    "quint8": (1,),
    "quint4x2": (1, 2),
    "int32": (8,),
    "float8_e4m3fn": (1,),
    "float8_e5m2": (1,),
    "float8_e4m3fnuz": (1,),
    "float8_e5m2fnuz": (1,),
}
_FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
_EVIDENCE_WEIGHTS = 8
_MIN_HELD = 4  # float copies of distinct quantised weights alive together: a merge's burst


def _numel_of(trace: Trace) -> np.ndarray:
    """Element count of every row's block: from its shape, else bytes / itemsize, else -1."""
    ev = trace.events
    shape_numel = np.array([math.prod(s) for s in trace.shapes] + [-1], dtype=np.int64)
    itemsize = np.array([DTYPE_BYTES.get(s, 0) for s in trace.strings] + [0], dtype=np.int64)
    size = itemsize[ev["dtype"]]  # dtype -1 -> the appended 0
    by_bytes = np.where(size > 0, ev["nbytes"] // np.maximum(size, 1), -1)
    return np.where(ev["shape"] >= 0, shape_numel[ev["shape"]], by_bytes)


def detect(ctx: Context) -> list[Finding]:
    """Quantised weights dequantised per call (or kept dequantised); else half-precision weights
    upcast per call (``weight_upcast``)."""
    return _quantised(ctx) or weight_upcast.detect(ctx)


def _quantised(ctx: Context) -> list[Finding]:
    trace = ctx.trace
    min_blocks = int(ctx.threshold(PATTERN, "min_blocks", 2))
    min_weight_bytes = int(ctx.threshold(PATTERN, "min_weight_bytes", 64 * 1024))
    n = trace.num_events
    if n == 0:
        return []
    ev = trace.events
    dev = ctx.analysis.device
    on_dev = ev["device"] == dev
    action, category = ev["action"], ev["category"]
    strings = trace.strings
    quant_ids = {i: _QUANT_FACTORS[s] for i, s in enumerate(strings) if s in _QUANT_FACTORS}
    if not quant_ids:
        return []
    is_start = (action == Action.ALLOC) | (action == Action.PREEXISTING) | (action == Action.MAP)
    is_weight = (category == Category.WEIGHT) | (category == Category.BUFFER)
    # Quantised weights: integer weights and buffers, and integer blocks the user's own code made
    # outside every module (a merge script quantising layers before it attaches them) and that died
    # before any call tagged them as weights.
    made_outside = (category == Category.OTHER) & (ev["module"] < 0)
    w_rows = np.flatnonzero(
        is_start
        & (is_weight | made_outside)
        & on_dev
        & np.isin(ev["dtype"], list(quant_ids))
        & (ev["nbytes"] >= min_weight_bytes)
    )
    if len(w_rows) == 0:
        return []
    numel = _numel_of(trace)
    w_numel = numel[w_rows]
    w_module = ev["module"][w_rows].astype(np.int64)

    # Candidate copies: blocks made during the run (not weights), freed again.
    fidx = ctx.analysis.free_index
    made = np.flatnonzero((action == Action.ALLOC) & on_dev & ~is_weight)
    made = made[np.isin(category[made], (Category.TEMPORARY, Category.ACTIVATION, Category.OTHER))]
    float_ids = [i for i, s in enumerate(strings) if s in _FLOAT_DTYPES]
    c_rows = made[fidx[made] < n]
    if len(c_rows) == 0 and len(made) == 0:
        return []
    c_numel = numel[c_rows]
    c_module = ev["module"][c_rows].astype(np.int64)

    # Short-lived: freed before the step that made them returns (when there are steps).
    steps = np.flatnonzero(trace.spans["kind"] == SpanKind.STEP)
    if len(steps):
        s_start = trace.spans["start_us"][steps]
        order = np.argsort(s_start)
        s_start, s_end = s_start[order], trace.spans["end_us"][steps][order]
        t_alloc = ev["time_us"][c_rows]
        k = np.searchsorted(s_start, t_alloc, side="right") - 1
        in_step = (k >= 0) & (t_alloc <= s_end[np.maximum(k, 0)])
        t_free = ev["time_us"][fidx[c_rows]]
        step_end = s_end[np.maximum(k, 0)]
        # A copy that outlives its step but dies in the backward pass that follows was saved for
        # backward (the costliest case): it stays a candidate.
        bw_t = np.sort(ev["time_us"][(action == Action.ALLOC) & (ev["phase"] == Phase.BACKWARD)])
        saved_for_backward = np.searchsorted(bw_t, t_free, side="right") > np.searchsorted(bw_t, step_end, side="right")
        short = ~in_step | (t_free <= step_end) | saved_for_backward
        c_rows, c_numel, c_module = c_rows[short], c_numel[short], c_module[short]
    # Kept copies: float blocks a module made inside a call and kept past it (``self._w =
    # self.dequantize()`` on the first call, "to avoid dequantizing again"): every layer then holds
    # its quantised weight and a float copy, more than the float model it replaced.
    kept = _kept(trace, made[np.isin(ev["dtype"][made], float_ids) & (ev["module"][made] >= 0)], fidx)

    # Join on (module, element count): key = module << 40 | numel (element counts < 2**40).
    owner: dict[int, int] = {}  # key -> index into w_rows (largest weight wins a tie)
    for i in np.argsort(-ev["nbytes"][w_rows], kind="stable").tolist():
        if w_numel[i] <= 0 or w_module[i] < 0:
            continue
        for factor in quant_ids[int(ev["dtype"][w_rows[i]])]:
            owner.setdefault((int(w_module[i]) << 40) | int(w_numel[i] * factor), i)
    if not owner:  # quantised blocks outside every module: a checkpoint read, dequantized at load?
        return _at_load(ctx, w_rows, w_numel, quant_ids, float_ids)
    keys = np.array(sorted(owner), dtype=np.int64)
    key_owner = np.array([owner[k] for k in keys.tolist()], dtype=np.int64)
    c_key = (c_module << 40) | np.maximum(c_numel, 0)
    pos = np.minimum(np.searchsorted(keys, c_key), len(keys) - 1)
    hit = (keys[pos] == c_key) & (c_module >= 0) & (c_numel > 0)
    m_rows, m_owner = c_rows[hit], key_owner[pos[hit]]
    k_key = (ev["module"][kept].astype(np.int64) << 40) | np.maximum(numel[kept], 0)
    k_pos = np.minimum(np.searchsorted(keys, k_key), len(keys) - 1)
    k_hit = keys[k_pos] == k_key
    kept, kept_owner = kept[k_hit], key_owner[k_pos[k_hit]]
    if len(np.unique(kept_owner)) < 2:  # one module's kept copy: a layer's own business, not a cache
        kept, kept_owner = kept[:0], kept_owner[:0]
    # Copies made outside every module (a merge or export script dequantising the weights itself,
    # ``{n: q.dequantize() for n, q in layers.items()}``) join on the element count alone: float,
    # made after a quantised weight of that size existed, and held together at the peak.
    loose = ~hit & (c_module < 0) & (c_numel > 0) & np.isin(ev["dtype"][c_rows], float_ids)
    if loose.any():
        l_rows, l_owner = _held_together(ctx, c_rows[loose], c_numel[loose], w_rows, w_numel, quant_ids)
        order = np.argsort(np.concatenate([m_rows, l_rows]), kind="stable")
        m_rows = np.concatenate([m_rows, l_rows])[order]
        m_owner = np.concatenate([m_owner, l_owner])[order]
    counts = np.bincount(m_owner, minlength=len(w_rows))
    keep = counts[m_owner] >= min_blocks
    m_rows, m_owner = m_rows[keep], m_owner[keep]
    if len(kept):
        order = np.argsort(np.concatenate([m_rows, kept]), kind="stable")
        m_rows = np.concatenate([m_rows, kept])[order]
        m_owner = np.concatenate([m_owner, kept_owner])[order]
    if len(m_rows) == 0:
        return _at_load(ctx, w_rows, w_numel, quant_ids, float_ids)

    live = ctx.analysis.live_bytes
    peak_row = int(np.argmax(live))
    peak_bytes = int(live[peak_row])
    at_peak = (m_rows <= peak_row) & (fidx[m_rows] > peak_row)
    m_bytes = ev["nbytes"][m_rows]
    wasted = int(m_bytes[at_peak].sum())

    is_float = np.isin(ev["dtype"][m_rows], float_ids)
    per_weight: list[dict[str, Any]] = []
    for i in np.unique(m_owner).tolist():
        mine = m_owner == i
        row = int(w_rows[i])
        floats = mine & is_float
        per_weight.append(
            {
                "module": trace.string(int(ev["module"][row])),
                "dtype": trace.string(int(ev["dtype"][row])),
                "shape": list(trace.shape(int(ev["shape"][row])) or ()),
                "weight_bytes": int(ev["nbytes"][row]),
                "copies": int(mine.sum()),
                "float_copies": int(floats.sum()),
                "float_dtype": trace.string(int(np.bincount(ev["dtype"][m_rows[floats]]).argmax()))
                if floats.any()
                else None,
                "bytes_each": int(np.median(m_bytes[floats] if floats.any() else m_bytes[mine])),
                "bytes_allocated": int(m_bytes[mine].sum()),
                "bytes_at_peak": int(m_bytes[mine & at_peak].sum()),
                "packed_int4": bool(np.any(numel[m_rows[mine]] > w_numel[i])),
            }
        )
    per_weight.sort(key=lambda w: (-w["bytes_at_peak"], -w["bytes_allocated"]))
    total_allocated = int(m_bytes.sum())
    worst = per_weight[0]
    int4 = any(w["packed_int4"] for w in per_weight)
    kernel = (
        "torch._weight_int4pack_mm (CUDA) / torch.ops.aten._weight_int4pack_mm_for_cpu on weights packed by "
        "_convert_weight_to_int4pack(_for_cpu)"
        if int4
        else "torch._weight_int8pack_mm (int8 weight, per-channel scale)"
    )
    evidence = {
        "bytes_at_peak": wasted,
        "float_copies": int(is_float.sum()),
        "copies": int(len(m_rows)),
        "bytes_allocated": total_allocated,
        "quantized_weights": len(per_weight),
        "quantized_weight_bytes": int(ev["nbytes"][w_rows].sum()),
        "peak_bytes": peak_bytes,
        "weights": per_weight[:_EVIDENCE_WEIGHTS],
    }
    # Copies alive across a backward allocation were saved for backward (F.linear(x, W.to(dtype)) with x
    # requiring grad): they live from forward to backward, the costliest case.
    backward_t = np.sort(ev["time_us"][(ev["action"] == Action.ALLOC) & (ev["phase"] == Phase.BACKWARD)])
    t_alloc = ev["time_us"][m_rows]
    t_free = np.where(fidx[m_rows] < n, ev["time_us"][np.minimum(fidx[m_rows], n - 1)], np.iinfo(np.int64).max)
    saved = np.searchsorted(backward_t, t_free, side="right") > np.searchsorted(backward_t, t_alloc, side="right")
    evidence["saved_for_backward_copies"] = int(saved.sum())
    evidence["saved_for_backward_bytes_at_peak"] = int(m_bytes[saved & at_peak].sum())
    both = (
        f"saves {format_bytes(wasted)} at the peak ({format_bytes(total_allocated)} allocated in {len(m_rows)} copies)"
    )
    if saved.any():
        fix = (
            f"{int(saved.sum())} float copies of quantised weights are saved for backward (F.linear on a "
            "dequantised weight with an input that requires grad): wrap the matmul in a torch.autograd.Function "
            "that saves only the quantised weight and dequantises again in backward (what bitsandbytes' "
            f"MatMul8bitLt does), or use a fused kernel ({kernel}): {both}"
        )
    else:
        fix = (
            f"the float weight is materialised on every call ({len(m_rows)} copies): keep the weights quantised "
            f"while computing with a fused kernel ({kernel}) or dequantise tile by tile (memwarden.quantize's "
            f"tiled kernel): {both}"
        )
    # Many layers' float copies alive together, made outside the model (every weight dequantised
    # before merging): the fix is to dequantise, merge and re-quantise one layer at a time; the run
    # then frees each copy as soon as it is made, and one layer's copy is the most alive at once.
    outside = m_rows[(ev["module"][m_rows] < 0) & at_peak & is_float]
    change = Change(drop=m_rows)  # the fused kernel makes no float copy
    lines: list[dict[str, Any]] = []  # diagnose names the lines inside the module (INNER_FIRST)
    kept_at_peak = kept[(kept <= peak_row) & (fidx[kept] > peak_row)]
    if len(kept_at_peak) and int(ev["nbytes"][kept_at_peak].sum()) * 2 >= wasted:
        held = int(ev["nbytes"][kept_at_peak].sum())
        fix = (
            f"{len(np.unique(kept_owner))} quantised layers keep a float copy of their weight after the call that "
            f"dequantised it (a cache: {format_bytes(held)} of float weights beside the quantised ones at the peak, "
            f"more than the quantisation saved): do not cache the dequantised weight on the module; dequantize per "
            f"call, on the fly, and let the temporary go after the matmul, or use a fused kernel ({kernel}): {both}"
        )
        # without the cache each call's copy lives only through its matmul
        change = Change(free_rows=kept, free_at=np.minimum(kept + 1, n - 1))
        lines = _asking_lines(ctx, kept_at_peak, outside_forward=False)
    if len(outside) >= 2 and int(ev["nbytes"][outside].sum()) * 2 >= wasted:
        one = int(ev["nbytes"][outside].max())
        fix = (
            f"{len(outside)} quantised weights are dequantised together and held at once "
            f"({format_bytes(int(ev['nbytes'][outside].sum()))} of float copies at the peak, one layer's is "
            f"{format_bytes(one)}): dequantise, merge and re-quantise one layer at a time (layer by layer, freeing "
            f"each float copy before the next), as PEFT's merge_and_unload does: {both}"
        )
        change = Change(free_rows=outside, free_at=outside + 1)
        lines = _asking_lines(ctx, outside)
    severity = severity_for(wasted, peak_bytes)
    if wasted < 0.01 * peak_bytes and total_allocated >= peak_bytes:
        severity = "low"  # heavy over the run but not at its peak: a hint
    return [
        Finding(
            pattern=PATTERN,
            severity=severity,
            bytes_at_peak=wasted,
            wasted_bytes=wasted,
            where=str(worst["module"]),
            evidence=evidence,
            fix=fix,
            change=change,
            lines=lines,
        )
    ]


def _held_together(
    ctx: Context,
    rows: np.ndarray,
    numel: np.ndarray,
    w_rows: np.ndarray,
    w_numel: np.ndarray,
    quant_ids: dict[int, tuple[int, ...]],
) -> tuple[np.ndarray, np.ndarray]:
    """The float blocks made outside every module that are dequantised copies of the quantised
    weights ``w_rows``: each as large as one of them and made after it, and at least
    ``_MIN_HELD`` of them alive together at the peak, made with no quantised weight made between
    them, of at least two weight shapes (a merge that dequantises every layer first). Floats that
    quantising a model goes through (``(w / scale).round().to(torch.int8)``, a layer at a time)
    alternate with the weights they make, one shape at a time. Limit: a model whose quantised
    weights all have one shape, dequantised together, is not seen here."""
    ev = ctx.trace.events
    by_numel: dict[int, int] = {}  # element count -> index into w_rows (largest weight first)
    for i in np.argsort(-ev["nbytes"][w_rows], kind="stable").tolist():
        for factor in quant_ids[int(ev["dtype"][w_rows[i]])]:
            by_numel.setdefault(int(w_numel[i] * factor), i)
    owner = np.array([by_numel.get(int(k), -1) for k in numel.tolist()], dtype=np.int64)
    made_after = (owner >= 0) & (w_rows[np.maximum(owner, 0)] < rows)
    rows, owner = rows[made_after], owner[made_after]
    peak_row = int(np.argmax(ctx.analysis.live_bytes))
    alive = (rows <= peak_row) & (ctx.analysis.free_index[rows] > peak_row)
    held, held_owner = rows[alive], owner[alive]
    numel_of_rows = np.zeros(ctx.trace.num_events, dtype=np.int64)
    numel_of_rows[rows] = numel[made_after]
    # the largest run of them made with no quantised weight made in between
    segment = np.searchsorted(np.sort(w_rows), held)
    if not len(held):
        return held, held_owner
    best = np.bincount(segment).argmax()
    burst = segment == best
    # several weight shapes (a model's attention and MLP projections), not one tensor's chain of
    # temporaries while it is quantised (randn, / scale, round, clamp: one shape)
    shapes = np.unique(numel_of_rows[held[burst]]) if int(burst.sum()) >= _MIN_HELD else np.zeros(0, np.int64)
    if len(shapes) < 2:
        return held[:0], held_owner[:0]
    return held[burst], held_owner[burst]


def _at_load(
    ctx: Context, w_rows: np.ndarray, w_numel: np.ndarray, quant_ids: dict[int, tuple[int, ...]], float_ids: list[int]
) -> list[Finding]:
    """A quantised checkpoint dequantised whole at load: float weights of a quantised block's size,
    each made while that block was alive (from it: ``Linear(dequantize(q, scale))``), of several
    shapes, and at the peak beside the quantised blocks they came from (the checkpoint kept too).
    Quantising a float model runs the other way (the float weight first, the integer one after)."""
    trace = ctx.trace
    ev = trace.events
    fidx = ctx.analysis.free_index
    is_start = (ev["action"] == Action.ALLOC) | (ev["action"] == Action.PREEXISTING) | (ev["action"] == Action.MAP)
    is_weight = (ev["category"] == Category.WEIGHT) | (ev["category"] == Category.BUFFER)
    f_rows = np.flatnonzero(
        is_start & is_weight & np.isin(ev["dtype"], float_ids) & (ev["device"] == ctx.analysis.device)
    )
    by_numel: dict[int, np.ndarray] = {}
    for i in range(len(w_rows)):
        for factor in quant_ids[int(ev["dtype"][w_rows[i]])]:
            key = int(w_numel[i] * factor)
            by_numel[key] = np.append(by_numel.get(key, np.zeros(0, np.int64)), w_rows[i])
    numel = _numel_of(trace)
    floats, origins = [], []
    for f in f_rows.tolist():
        q = by_numel.get(int(numel[f]))
        if q is None:
            continue
        alive = q[(q < f) & (fidx[q] > f)]  # made before the float weight and alive when it was made
        if len(alive):
            floats.append(f)
            origins.append(int(alive[-1]))
    if len(floats) < _MIN_HELD or len(np.unique(numel[floats])) < 2:
        return []
    rows, origin = np.array(floats, dtype=np.int64), np.array(origins, dtype=np.int64)
    live = ctx.analysis.live_bytes
    peak_row = int(np.argmax(live))
    peak_bytes = int(live[peak_row])
    at_peak = (rows <= peak_row) & (fidx[rows] > peak_row)
    both = at_peak & (origin <= peak_row) & (fidx[origin] > peak_row)
    if int(both.sum()) * 2 < max(int(at_peak.sum()), 1) or not both.any():
        return []
    wasted = int(ev["nbytes"][rows[both]].sum())
    quant_bytes = int(ev["nbytes"][origin[both]].sum())
    dtype = trace.string(int(ev["dtype"][origin[0]]))
    fdtype = trace.string(int(ev["dtype"][rows[0]]))
    fix = (
        f"{len(rows)} {dtype} weights are dequantized to {fdtype} at load and the {dtype} blocks are kept beside "
        f"them ({format_bytes(wasted)} of float weights over {format_bytes(quant_bytes)} of {dtype} at the peak): "
        f"keep the weights quantized ({dtype}) and dequantize on the fly at runtime, one layer per forward (a "
        f"quantized linear whose forward dequantizes its own weight, or a fused kernel such as "
        f"torch._weight_int8pack_mm): saves {format_bytes(wasted)} at the peak"
    )
    evidence = {
        "bytes_at_peak": wasted,
        "dequantized_weights": len(rows),
        "quantized_bytes_at_peak": quant_bytes,
        "float_dtype": fdtype,
        "quantized_dtype": dtype,
        "peak_bytes": peak_bytes,
    }
    modules = ev["module"][rows]
    where = (trace.string(int(modules[modules >= 0][0])) if (modules >= 0).any() else None) or "load"
    return [
        Finding(
            pattern=PATTERN,
            severity=severity_for(wasted, peak_bytes),
            bytes_at_peak=wasted,
            wasted_bytes=wasted,
            where=where,
            evidence=evidence,
            fix=fix,
            change=Change(drop=rows[both]),
            lines=_asking_lines(ctx, rows, outside_forward=True),
        )
    ]


def _kept(trace: Trace, rows: np.ndarray, fidx: np.ndarray) -> np.ndarray:
    """The blocks of ``rows`` (made inside a module) still alive when the root call (step) that made
    them has returned: kept by the module, not a temporary of the call."""
    steps = np.flatnonzero(trace.spans["kind"] == SpanKind.STEP)
    if not len(steps) or not len(rows):
        return rows[:0]
    ev = trace.events
    s_start = trace.spans["start_us"][steps]
    order = np.argsort(s_start)
    s_start, s_end = s_start[order], trace.spans["end_us"][steps][order]
    t = ev["time_us"][rows]
    k = np.searchsorted(s_start, t, side="right") - 1
    in_step = (k >= 0) & (t <= s_end[np.maximum(k, 0)])
    n = trace.num_events
    t_free = np.where(fidx[rows] < n, ev["time_us"][np.minimum(fidx[rows], n - 1)], np.iinfo(np.int64).max)
    # outlives its step, and the next step too (a copy saved for backward dies in the backward after)
    nxt = np.minimum(k + 1, len(s_end) - 1)
    outlives = t_free > np.where(k + 1 < len(s_end), s_end[nxt], s_end[np.maximum(k, 0)])
    return rows[in_step & outlives]


def _asking_lines(ctx: Context, rows: np.ndarray, outside_forward: bool = True) -> list[dict[str, Any]]:
    """The script's statement that asked for the copies (``{n: q.dequantize() for ...}``) first,
    up from the helper that made them, then the line that made them."""
    made = lines_of_rows(ctx.trace, rows, 1, callers=False)
    if not made:
        return []
    site = made[0]
    scripts = script_files([s.call_site or "" for s in ctx.analysis.steps]) or [site.file]
    holder = holding_line(site.file, site.line, site.function, scripts, outside_forward=outside_forward)
    out = [{"file": site.file, "line": site.line, "nbytes": site.nbytes}]
    if holder is not None and (holder.file, holder.line) != (site.file, site.line):
        out.insert(0, {"file": holder.file, "line": holder.line, "nbytes": site.nbytes})
    return out
