"""alignment-padding: tensors padded or expanded beyond the data written into them.

Fusion and alignment code often makes a block larger than its data: ``F.pad`` to
the next power of two, ``pad_sequence`` / ``torch.zeros(B, max_len, D)`` filled
row by row, ``torch.cat([x, zeros])`` up to ``max_image_tokens``, or
``x.expand(...).contiguous()``. The capture records, per block, the bytes ops
wrote into it (``written_bytes``: the tensor inputs of the op that made it plus
the sources of later in-place writes), so a padded block is one whose
``nbytes >= min_ratio * written_bytes``.

A ``cat`` counts its zero input as written data, so for ``cat`` the data bytes
are the written bytes minus those of a fill block (zeros/full/empty, never
written, or made from a template tensor by ``new_zeros``/``zeros_like``) of the
same module and dtype that was alive when the ``cat`` ran; that fill block is
then part of the cat's finding, not one of its own.

The waste is the padded bytes live at the peak, plus the padded share of the
activations computed from a padded block while it was alive ("downstream":
blocks whose shape carries the padded length on a non-feature axis). A group
whose padding is not live at the peak reports the most padded bytes live at
once, at low severity: fixing it does not lower the peak.

Padding made outside torch (a tokenizer or collator padding to ``max_length`` in
Python or numpy) is judged from the steps' attention masks instead: see
``padding_inputs``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding, severity_for
from memwarden.analyze.lines import led_by, lines_of_rows
from memwarden.analyze.patterns.padding_inputs import input_padding_findings
from memwarden.analyze.timeline import live_blocks_at
from memwarden.trace.model import Action, Category, Trace
from memwarden.units import format_bytes

PATTERN = "alignment-padding"

# Ops that make a block of padding/fill (its data comes from later writes or from its input).
PAD_OPS = frozenset(
    {"aten::pad", "aten::constant_pad_nd", "aten::pad_sequence", "aten::reflection_pad1d", "aten::replication_pad1d"}
)
FILL_OPS = frozenset(
    {
        "aten::zeros",
        "aten::new_zeros",
        "aten::zeros_like",
        "aten::full",
        "aten::new_full",
        "aten::full_like",
        "aten::empty",
        "aten::new_empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::new_empty_strided",
    }
)
# Factory ops that take a template tensor for its shape/dtype only. The capture counts the template
# as written data (it is a tensor input), so their written_bytes overstates the data: by the block's
# own size for *_like (same shape and, almost always, dtype), by an unknown amount for new_*.
LIKE_OPS = frozenset({"aten::zeros_like", "aten::empty_like", "aten::full_like"})
TEMPLATE_OPS = LIKE_OPS | {"aten::new_zeros", "aten::new_empty", "aten::new_full", "aten::new_empty_strided"}
# Ops that materialise a broadcast view. Not aten::reshape: that is how transformers' repeat_kv
# expands grouped-query KV heads, a different waste with a different fix.
MATERIALISE_OPS = frozenset({"aten::contiguous", "aten::clone", "aten::repeat", "aten::expand_copy", "aten::tile"})
CAT_OPS = frozenset({"aten::cat", "aten::concat", "aten::concatenate"})

_MIN_SEQ_LEN = 8  # shorter axes (heads, channels) are not sequences a padding could stretch
_KIND_NONE, _KIND_PAD, _KIND_FILL, _KIND_MATERIALISE, _KIND_CAT = 0, 1, 2, 3, 4
_SCANNED = np.array([Category.ACTIVATION, Category.TEMPORARY, Category.INPUT, Category.OTHER], dtype=np.uint8)
_DOWNSTREAM = np.array([Category.ACTIVATION, Category.TEMPORARY, Category.OTHER], dtype=np.uint8)


def _op_kinds(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(kind, is-template-op, is-like-op) of every string-table entry as an op name; index -1 (no op)
    maps to the last slot."""
    kinds = np.zeros(len(trace.strings) + 1, dtype=np.int8)
    template = np.zeros(len(trace.strings) + 1, dtype=bool)
    like = np.zeros(len(trace.strings) + 1, dtype=bool)
    for i, name in enumerate(trace.strings):
        template[i] = name in TEMPLATE_OPS
        like[i] = name in LIKE_OPS
        if name in PAD_OPS:
            kinds[i] = _KIND_PAD
        elif name in FILL_OPS:
            kinds[i] = _KIND_FILL
        elif name in MATERIALISE_OPS:
            kinds[i] = _KIND_MATERIALISE
        elif name in CAT_OPS:
            kinds[i] = _KIND_CAT
    return kinds, template, like


def _cat_fillers(rows: np.ndarray, fillers: np.ndarray, e: dict[str, np.ndarray], fi: np.ndarray) -> np.ndarray:
    """For each cat row, the row of the fill block it most likely concatenated (-1 if none)."""
    out = np.full(len(rows), -1, dtype=np.int64)
    if len(rows) == 0 or len(fillers) == 0:
        return out
    j = np.searchsorted(fillers, rows) - 1
    has = j >= 0
    f = fillers[np.clip(j, 0, None)]
    ok = (
        has
        & (fi[f] > rows)  # still alive when the cat ran
        & (e["module"][f] == e["module"][rows])
        & (e["dtype"][f] == e["dtype"][rows])
        & (e["nbytes"][f] < e["nbytes"][rows])
    )
    out[ok] = f[ok]
    return out


def _seq_lengths(shape: tuple[int, ...] | None) -> list[int]:
    """Lengths a padded block may carry on its sequence axes: not the feature (last) axis, not batch."""
    if not shape or len(shape) < 2:
        return []
    axes = shape[1:-1] if len(shape) >= 3 else shape[:-1]
    return sorted({int(d) for d in axes if d >= _MIN_SEQ_LEN})


def _padded_share(shape: tuple[int, ...] | None, lengths: list[int], fraction: float) -> float:
    """Share of a downstream block that is padding: padded positions / its sequence length.

    The owner pads ``L * fraction`` of its ``L`` positions; a downstream block whose sequence axis
    is ``Lx`` in ``[L, 4L]`` (the padded tokens, perhaps joined with others) carries them too.
    """
    if not shape or len(shape) < 2:
        return 0.0
    best = 0.0
    for lx in shape[:-1]:
        for length in lengths:
            if length <= lx <= 4 * length:
                best = max(best, length * fraction / lx)
    return best


def _max_live(alloc_rows: np.ndarray, free_rows: np.ndarray, amounts: np.ndarray, n: int) -> int:
    """Most of ``amounts`` live at once, blocks live from their alloc row to their free row."""
    if len(alloc_rows) == 0:
        return 0
    freed = free_rows < n
    at = np.concatenate([alloc_rows, free_rows[freed]])
    delta = np.concatenate([amounts, -amounts[freed]])
    order = np.lexsort((delta, at))  # a free and an alloc on one row: free first
    return int(np.cumsum(delta[order]).max(initial=0))


def _fix(kind: int, module: str, saving: int, at_peak: bool) -> str:
    where = f"In {module}" if module != "(no module)" else "Where the batch is assembled"
    gain = f"saves {format_bytes(saving)} at peak" if at_peak else f"saves {format_bytes(saving)} (not at the peak)"
    if kind == _KIND_MATERIALISE:
        return (
            f"{where}: keep the broadcast view instead of materialising it (drop .contiguous()/.clone()/.repeat() "
            f"after expand, or let the consuming op broadcast); {gain}."
        )
    return (
        f"{where}: pad to the batch's longest sequence, not a power of two or a fixed max length; or pack the "
        f"sequences (varlen attention with cu_seqlens, nested tensors) so no padding is stored; {gain}."
    )


def detect(ctx: Context) -> list[Finding]:
    """Blocks torch ops padded, and batches padded outside torch (``padding_inputs``)."""
    trace = ctx.trace
    min_ratio = float(ctx.threshold(PATTERN, "min_ratio", 1.5))
    return _op_findings(trace, ctx, min_ratio) + input_padding_findings(trace, ctx, min_ratio)


def _op_findings(trace: Trace, ctx: Context, min_ratio: float) -> list[Finding]:
    n = trace.num_events
    if n == 0:
        return []
    e = trace.events
    dev = ctx.analysis.device
    live = ctx.analysis.live_bytes
    p = int(np.argmax(live))
    peak_bytes = int(live[p])

    op_kinds, op_template, op_like = _op_kinds(trace)
    kinds = op_kinds[e["op"]]  # op -1 -> last slot (none)
    on = (e["action"] == Action.ALLOC) & (e["device"] == dev)
    scanned = on & np.isin(e["category"], _SCANNED)
    if not np.any(scanned & (kinds != _KIND_NONE)):
        return []
    fi = ctx.analysis.free_index
    written = e["written_bytes"]
    nbytes = e["nbytes"]

    like = op_like[e["op"]] & (written >= nbytes)
    data = np.where(written >= 0, np.minimum(np.where(like, written - nbytes, written), nbytes), -1)
    cat_rows = np.flatnonzero(scanned & (kinds == _KIND_CAT) & (written > 0))
    fillers = np.flatnonzero(on & (kinds == _KIND_FILL) & ((written == 0) | op_template[e["op"]]))
    filler_of_cat = _cat_fillers(cat_rows, fillers, e, fi)
    has_filler = filler_of_cat >= 0
    data[cat_rows[has_filler]] = np.maximum(written[cat_rows[has_filler]] - nbytes[filler_of_cat[has_filler]], 0)

    padded = scanned & (kinds != _KIND_NONE) & (data > 0) & (nbytes >= min_ratio * np.maximum(data, 1))
    padded[filler_of_cat[has_filler]] = False  # counted in the cat that consumed it
    rows = _beyond_longest(trace, np.flatnonzero(padded))
    rows = rows[~_attention_mask(trace, rows, kinds)]
    if len(rows) == 0:
        return []
    pad_bytes = nbytes[rows] - data[rows]
    live_at_peak = (rows <= p) & (fi[rows] > p)
    live_at_peak_rows = live_blocks_at(trace, p, dev, fi)

    # downstream: blocks live at the peak, made while a padded block was alive, carrying its padded length
    owner = _downstream_owner(trace, rows, pad_bytes / nbytes[rows], fi, on, padded, p)

    keys = e["module"][rows].astype(np.int64) * (len(trace.strings) + 2) + e["op"][rows].astype(np.int64)
    findings = []
    for key in np.unique(keys):
        sel = keys == key
        g_rows = rows[sel]
        r0 = int(g_rows[0])
        module = trace.string(int(e["module"][r0])) or "(no module)"
        op = trace.string(int(e["op"][r0])) or "(unknown op)"
        kind = int(kinds[r0])
        at_peak = int(pad_bytes[sel & live_at_peak].sum()) if np.any(live_at_peak[sel]) else 0
        down_bytes = 0
        down_count = 0
        for k in np.flatnonzero(sel):
            d = owner.get(int(k))
            if d is not None:
                down_bytes += d[0]
                down_count += d[1]
        max_live = _max_live(g_rows, fi[g_rows], pad_bytes[sel], n)
        waste_at_peak = at_peak + down_bytes
        if waste_at_peak > 0:
            wasted, severity = waste_at_peak, severity_for(waste_at_peak, peak_bytes)
        else:
            wasted, severity = max_live, "low"
        shapes: dict[tuple[int, ...], int] = {}
        for r in g_rows.tolist():
            s = trace.shape(int(e["shape"][r]))
            if s is not None:
                shapes[s] = shapes.get(s, 0) + 1
        total = int(nbytes[g_rows].sum())
        data_total = int(data[g_rows].sum())
        evidence: dict[str, Any] = {
            "module": module,
            "op": op,
            "count": int(len(g_rows)),
            "shapes": [[list(s), c] for s, c in sorted(shapes.items(), key=lambda kv: -kv[1])[:5]],
            "bytes": total,
            "data_bytes": data_total,
            "ratio": round(total / data_total, 2) if data_total else None,
            "padded_bytes_at_peak": at_peak,
            "downstream_padded_bytes_at_peak": down_bytes,
            "downstream_blocks_at_peak": down_count,
            "max_padded_bytes_live": max_live,
            "min_ratio": min_ratio,
        }
        findings.append(
            Finding(
                pattern=PATTERN,
                severity=severity,
                bytes_at_peak=int(nbytes[g_rows[live_at_peak[sel]]].sum()),
                wasted_bytes=int(wasted),
                where=f"{module} / {op}",
                evidence=evidence,
                fix=_fix(kind, module, int(wasted), waste_at_peak > 0),
                # the fix makes each padded block only as large as the data written into it
                change=Change(scale_rows=g_rows, scale=data[g_rows] / np.maximum(nbytes[g_rows], 1)),
                # The padding op's own line first (the F.pad / cat to a fixed slot to take out, even
                # inside the model's forward), then the call that ran it, then the lines holding the
                # activations at the peak (the padded positions' downstream work).
                lines=led_by(
                    lines_of_rows(trace, g_rows, 1, callers=False) + lines_of_rows(trace, g_rows, 1, callers=True),
                    trace,
                    "",
                    live_at_peak_rows,
                    PATTERN,
                ),
            )
        )
    return findings


def _attention_mask(trace: Trace, rows: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """Rows that are a model's own attention mask: filled inside a module's forward, shaped
    (N, N) or (B, 1, N, N) (Pixtral's block-diagonal mask over the images' patches, a causal mask).
    Its fill value is the masking, not padding a collator could leave out: the cost is N, the
    tokens, which vision-token-dominance judges."""
    e = trace.events
    out = np.zeros(len(rows), dtype=bool)
    for i, r in enumerate(rows.tolist()):
        shape = trace.shape(int(e["shape"][r])) or ()
        if kinds[r] != _KIND_FILL or e["module"][r] < 0 or len(shape) < 2 or shape[-1] != shape[-2] or shape[-1] < 2:
            continue
        out[i] = len(shape) == 2 or shape[-3] == 1
    return out


def _beyond_longest(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """The padded blocks less those of a batch padded to its longest row: a block made for a step
    whose attention mask says its length is the longest row's (``metadata["input_padding"]``),
    carrying that length on an axis (``torch.zeros(B, longest)`` filled row by row: as small as a
    rectangular batch gets; bucketing by length is another matter)."""
    steps = []  # (start, length, padded to the longest row)
    for item in trace.metadata.get("input_padding", ()) or ():
        try:
            start, length, longest = int(item["start_us"]), int(item["length"]), int(item["longest"])
        except (KeyError, TypeError, ValueError):
            continue
        steps.append((start, length, length <= longest))
    if not any(t for _, _, t in steps) or not len(rows):
        return rows
    tight = sorted(steps)
    starts = np.array([t for t, _, _ in tight], dtype=np.int64)
    e = trace.events
    nxt = np.searchsorted(starts, e["time_us"][rows], side="left")  # the first step starting after
    keep = np.ones(len(rows), dtype=bool)
    for i, (r, k) in enumerate(zip(rows.tolist(), nxt.tolist(), strict=True)):
        shape = trace.shape(int(e["shape"][r])) if e["shape"][r] >= 0 else None
        if k < len(tight) and tight[k][2] and shape is not None and tight[k][1] in shape:
            keep[i] = False
    return rows[keep]


def _downstream_owner(
    trace: Trace, rows: np.ndarray, fractions: np.ndarray, fi: np.ndarray, on: np.ndarray, padded: np.ndarray, p: int
) -> dict[int, tuple[int, int]]:
    """Index into ``rows`` -> (padded bytes, count) of the downstream blocks live at the peak that it owns.

    A block is downstream of the most recent padded block still alive when it was made, if its
    shape carries that block's padded sequence length.
    """
    e = trace.events
    cand = on & ~padded & np.isin(e["category"], _DOWNSTREAM)
    cand[p + 1 :] = False
    d_rows = np.flatnonzero(cand)
    d_rows = d_rows[fi[d_rows] > p]
    if len(d_rows) == 0:
        return {}
    k = np.searchsorted(rows, d_rows) - 1
    ok = k >= 0
    k = np.clip(k, 0, None)
    ok &= fi[rows[k]] > d_rows
    d_rows, k = d_rows[ok], k[ok]
    out: dict[int, tuple[int, int]] = {}
    lengths_of: dict[int, list[int]] = {}
    share_of: dict[tuple[int, int], float] = {}
    for d, kk in zip(d_rows.tolist(), k.tolist(), strict=True):
        owner_shape = int(e["shape"][rows[kk]])
        if owner_shape not in lengths_of:
            lengths_of[owner_shape] = _seq_lengths(trace.shape(owner_shape))
        key = (int(e["shape"][d]), kk)
        share = share_of.get(key)
        if share is None:
            share = share_of[key] = _padded_share(trace.shape(key[0]), lengths_of[owner_shape], float(fractions[kk]))
        if share > 0:
            b, c = out.get(kk, (0, 0))
            out[kk] = (b + int(e["nbytes"][d] * share), c + 1)
    return out
