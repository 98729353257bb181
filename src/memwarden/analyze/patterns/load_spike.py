"""load-spike: weights materialised twice (or three times) while loading.

Typical causes: a model built in float32 and then cast (``.half()``,
``.to(torch.bfloat16)``); ``torch.load`` of a full state dict (no mmap) next
to an already materialised model, then ``load_state_dict`` copying into it;
both at once. The load phase then peaks at 2-3x the weights the run keeps,
often the largest footprint of the whole run on a small device.

What the trace shows: the load window is everything before the first module
call (the capture's ``load`` phase). The final weights ``F`` are the weight and
buffer blocks live when it ends. Duplicates are the other blocks made in the
window whose shape is the shape of a final weight: float32 parameters that a
cast replaced (their storages died before the capture saw them as weights),
state-dict tensors from ``torch.load``. The pattern fires when the weight
bytes live at the load-phase peak (final weights made so far plus duplicates)
are at least ``min_ratio`` (1.5) times ``F``. Counting weight-shaped blocks
only keeps inputs and other load-time data out of the ratio.

Waste: the trace's peak minus its peak with the duplicates removed throughout
(what building in the target dtype on the meta device and loading with
mmap + assign leaves), so a load spike that is not the run's peak costs
nothing.

Mapped weights: the capture records a checkpoint's mapped tensors from the
moment they are set on a module (MAP) to their release (UNMAP), so the float32
weights that ``from_pretrained(path).half()`` maps and then drops are
duplicates too (mapped weights released inside the load window, with the shape
of a weight the run keeps). Limit: duplicates are found by shape alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding, severity_for
from memwarden.analyze.lines import LineBytes, led_by, lines_of_rows
from memwarden.analyze.timeline import live_blocks_at
from memwarden.trace.model import Action, Category, SpanKind, Trace
from memwarden.units import format_bytes

PATTERN = "load-spike"
_QUANT_DTYPES = frozenset({"int8", "uint8", "int32", "qint8", "quint8", "quint4x2", "float8_e4m3fn", "float8_e5m2"})
_EVIDENCE_GROUPS = 6


def _load_end_row(trace: Trace) -> int:
    """First event row at or after the first module call (the end of the load window)."""
    modules = trace.spans["kind"] == SpanKind.MODULE
    if not modules.any():
        return trace.num_events
    first_call = int(trace.spans["start_us"][modules].min())
    return int(np.searchsorted(trace.events["time_us"], first_call, side="left"))


def detect(ctx: Context) -> list[Finding]:
    trace = ctx.trace
    min_ratio = float(ctx.threshold(PATTERN, "min_ratio", 1.5))
    min_share_of_weights = float(ctx.threshold(PATTERN, "min_share_of_weights", 0.5))
    n = trace.num_events
    end = _load_end_row(trace)
    if n == 0 or end == 0:
        return []
    ev = trace.events
    dev = ctx.analysis.device
    on_dev = ev["device"] == dev
    action, category = ev["action"], ev["category"]
    fidx = ctx.analysis.free_index
    is_start = ((action == Action.ALLOC) | (action == Action.PREEXISTING) | (action == Action.MAP)) & on_dev
    in_window = np.zeros(n, dtype=bool)
    in_window[:end] = True
    alive_at_end = fidx >= end

    is_weight = (category == Category.WEIGHT) | (category == Category.BUFFER)
    final_rows = np.flatnonzero(is_start & in_window & is_weight & alive_at_end)
    final_bytes = int(ev["nbytes"][final_rows].sum())
    if final_bytes <= 0:
        return []

    # Duplicates: non-weight blocks made in the window with the shape of a final weight.
    weight_shapes = np.unique(ev["shape"][final_rows])
    weight_shapes = weight_shapes[weight_shapes >= 0]
    anon_start = is_start & (action != Action.MAP)
    # Weights mapped from the checkpoint and released before the first call: a cast after loading
    # (``from_pretrained(path).half()``) replaced them, so they are duplicates of the weights kept.
    mapped_dropped = is_start & (action == Action.MAP) & is_weight & (fidx < end)
    # A mapped state dict copied into a model already materialised (``load_state_dict(load_file(p))``
    # after ``Model(config)``): every page is read into the second copy, both resident at once.
    mapped_state = is_start & (action == Action.MAP) & ~is_weight & (category != Category.INPUT)
    dup_rows = np.flatnonzero(
        ((anon_start & ~is_weight & (category != Category.INPUT)) | mapped_dropped | mapped_state)
        & in_window
        & np.isin(ev["shape"], weight_shapes)
    )
    # A duplicate must coexist with the weight it duplicates: one freed before any final weight of
    # its shape existed belongs to an earlier model that lived alone (built, saved or used, deleted,
    # then reloaded in another dtype), which costs nothing a reload could save.
    shape_col = ev["shape"]
    first_final: dict[int, int] = {}
    for row, shape in zip(final_rows.tolist(), shape_col[final_rows].tolist(), strict=True):
        first_final.setdefault(shape, row)
    replaced_after = np.array([first_final.get(s, n) for s in shape_col[dup_rows].tolist()], dtype=np.int64)
    dup_rows = dup_rows[fidx[dup_rows] > replaced_after]
    # A float block made after a quantised (integer) weight of its shape existed was dequantised from
    # it (a merge or export script): dequant-temporaries', not a second load of the model.
    quant = (
        is_start
        & (is_weight | (category == Category.OTHER))
        & np.isin(ev["dtype"], [i for i, s in enumerate(trace.strings) if s in _QUANT_DTYPES])
    )
    first_quant: dict[int, int] = {}
    for row, shape in zip(np.flatnonzero(quant).tolist(), shape_col[quant].tolist(), strict=True):
        first_quant.setdefault(shape, row)
    quant_before = np.array([first_quant.get(s, n) for s in shape_col[dup_rows].tolist()], dtype=np.int64)
    dup_rows = dup_rows[dup_rows < quant_before]
    if len(dup_rows) == 0:
        return []

    live = ctx.analysis.live_bytes
    load_peak_row = int(np.argmax(live[:end]))
    load_peak = int(live[load_peak_row])
    dup_at_load_peak = (dup_rows <= load_peak_row) & (fidx[dup_rows] > load_peak_row)
    dup_bytes = int(ev["nbytes"][dup_rows[dup_at_load_peak]].sum())
    final_at_load_peak = (final_rows <= load_peak_row) & (fidx[final_rows] > load_peak_row)
    weights_at_load_peak = int(ev["nbytes"][final_rows[final_at_load_peak]].sum()) + dup_bytes
    ratio = weights_at_load_peak / final_bytes
    if ratio < min_ratio:
        return []
    # The model materialised twice means most of its weights duplicated at once, not a layer at a
    # time (quantising a float checkpoint layer by layer keeps one float layer alive).
    # Counted in bytes: a cast parameter by parameter frees many small blocks (norms, biases) before
    # the peak while the large matrices are still duplicated, so most of the duplicates' bytes are
    # alive together at the load peak, where a layer-at-a-time conversion keeps one layer's.
    all_dup_bytes = int(ev["nbytes"][dup_rows].sum())
    if int(dup_at_load_peak.sum()) < 2 or dup_bytes < min_share_of_weights * all_dup_bytes:
        return []

    # The run without the duplicates: subtract their own live-bytes curve.
    dup_signed = np.zeros(n, dtype=np.int64)
    dup_signed[dup_rows] = ev["nbytes"][dup_rows]
    freed = fidx[dup_rows]
    freed = freed[freed < n]
    dup_signed[freed] -= ev["nbytes"][freed]
    peak_row = int(np.argmax(live))
    peak_bytes = int(live[peak_row])
    peak_without = int((live - np.cumsum(dup_signed)).max())
    wasted = peak_bytes - peak_without
    if wasted <= 0:
        return []

    # Which ops and dtypes made the duplicates live at the load peak.
    rows = dup_rows[dup_at_load_peak]
    groups: dict[tuple[int, int], list[int]] = {}
    for op, dt, nb in zip(
        ev["op"][rows].tolist(), ev["dtype"][rows].tolist(), ev["nbytes"][rows].tolist(), strict=True
    ):
        acc = groups.setdefault((op, dt), [0, 0])
        acc[0] += nb
        acc[1] += 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])
    blocks: list[dict[str, Any]] = [
        {
            "op": trace.string(op) or "(no op: torch.load / storage)",
            "dtype": trace.string(dt),
            "bytes": nb,
            "blocks": cnt,
        }
        for (op, dt), (nb, cnt) in ranked[:_EVIDENCE_GROUPS]
    ]
    final_dtypes = {trace.strings[d] for d in np.unique(ev["dtype"][final_rows]).tolist() if d >= 0}
    # The dtype a user names is the floating one (integer buffers such as position ids keep theirs).
    final_dtypes = {d for d in final_dtypes if "float" in d} or final_dtypes
    dup_dtypes = {trace.strings[d] for d in np.unique(ev["dtype"][rows]).tolist() if d >= 0}
    cast = bool(dup_dtypes - final_dtypes)
    kept = fidx[dup_rows] >= end
    evidence = {
        "load_peak_bytes": load_peak,
        "final_weight_bytes": final_bytes,
        "ratio": round(ratio, 3),  # weight bytes (final + duplicates) at the load peak / final weights
        "load_peak_ratio": round(load_peak / final_bytes, 3),
        "weight_bytes_at_load_peak": weights_at_load_peak,
        "duplicate_bytes_at_load_peak": dup_bytes,
        "duplicates_alive_after_load_bytes": int(ev["nbytes"][dup_rows[kept]].sum()),
        "duplicate_blocks": blocks,
        "cast_after_materialising": cast,
        "final_weight_dtypes": sorted(final_dtypes),
        "peak_bytes": peak_bytes,
        "peak_without_duplicates_bytes": peak_without,
    }
    saves = (
        f"saves {format_bytes(wasted)} at the peak ({format_bytes(weights_at_load_peak)} of weights at the load "
        f"peak = {ratio:.1f}x the {format_bytes(final_bytes)} the run keeps)"
    )
    mapped_share = int(ev["nbytes"][rows[action[rows] == Action.MAP]].sum()) / max(1, dup_bytes)
    evidence["mapped_duplicate_share"] = round(mapped_share, 3)
    if cast and mapped_share >= 0.5:
        # The checkpoint was mapped in its own dtype and the model cast afterwards.
        target = ", ".join(sorted(final_dtypes)) or "the target dtype"
        fix = (
            f"load in the target dtype: from_pretrained(path, dtype=torch.{target}) (torch_dtype= in "
            f"transformers 4) converts each weight as it is read, instead of mapping the checkpoint's "
            f"{', '.join(sorted(dup_dtypes))} weights and casting the whole model afterwards (.half() / .to(dtype)): {saves}"
        )
    elif cast and not (dup_dtypes & final_dtypes):
        # Every duplicate is in a dtype the run does not keep: the model was built (or loaded) in
        # one dtype and cast to another afterwards; building in the final one is the whole fix.
        target = " / ".join(f"torch.{d}" for d in sorted(final_dtypes)) or "the target dtype"
        fix = (
            f"build the model directly in its final dtype: from_pretrained(path, dtype={target}) (torch_dtype= in "
            f"transformers 4), Model._from_config(config, dtype={target}), or a hand-built model under "
            f"torch.set_default_dtype({target.split(' / ')[0]}), instead of building it in "
            f"{', '.join(sorted(dup_dtypes))} and casting it afterwards (.to(dtype) / .half()): {saves}"
        )
    else:
        how = (
            "build in the target dtype (from_pretrained(..., dtype=...) / Model._from_config(config, dtype=...)) "
            "instead of casting after materialising; "
            if cast
            else ""
        )
        fix = (
            f"{how}build on the meta device and load with torch.load(path, mmap=True) + "
            f"load_state_dict(state, assign=True) (or from_pretrained / safetensors, which map the file), so each "
            f"weight exists once, in its final dtype: {saves}"
        )
    top = blocks[0]
    return [
        Finding(
            pattern=PATTERN,
            severity=severity_for(wasted, peak_bytes),
            bytes_at_peak=dup_bytes,
            wasted_bytes=wasted,
            change=Change(drop=dup_rows),
            where=f"load: {top['op']} ({top['dtype']})",
            evidence=evidence,
            fix=fix,
            lines=_lines(trace, ctx, rows, peak_row),
        )
    ]


def _lines(trace: Trace, ctx: Context, dup_rows: np.ndarray, peak_row: int) -> list[dict[str, Any]]:
    """The lines that made the duplicates live at the load peak first, heaviest first, then the
    lines holding the most at the peak.

    A line inside a constructor (``Model.__init__`` making its parameters, or a comprehension in
    it: ``Model.__init__.<locals>.<genexpr>``) comes after the others. The fix (build on the meta
    device, in the target dtype) goes where the script builds the model, never in the model's
    definition; that line is not recorded (the constructor's frame is the innermost user frame),
    and the script's ``torch.load`` or cast line, which the fix changes too, is.
    """
    made = lines_of_rows(trace, dup_rows, 1 << 30, callers=False)
    ordered: list[LineBytes] = sorted(made, key=lambda x: "__init__" in x.function.split("."))  # stable sort
    live = live_blocks_at(trace, peak_row, ctx.analysis.device, ctx.analysis.free_index)
    return led_by(ordered, trace, "", live, PATTERN)
