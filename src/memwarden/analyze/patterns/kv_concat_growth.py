"""kv-concat-growth: a KV cache that grows by concatenation at every decode step.

``k = torch.cat([k, k_new], dim=-2)`` allocates the whole cache of length n+1 and
frees length n: for a moment both copies are live (a transient 2x of whatever is
concatenated at once), and over a generation O(n^2) bytes are allocated and copied
for O(n) bytes of cache. transformers' default ``DynamicCache`` does this one layer
at a time, so its transient is one layer's K or V; hand-written loops that build a
new list of layers while the old one is still referenced, or that keep every layer
in one stacked tensor, double the whole cache.

A trace shows it as chains of ``cat`` blocks of one module and dtype whose shapes
agree except on one axis (the sequence axis: -2 for (B, H, T, hd), -3 for
(B, T, H, hd)), whose length grows over time; a chain restarts when the length
drops (a new request). The waste is the superseded cache copies live at the
peak: in each chain, the shorter blocks still live while as many longer ones
already exist. The churn (bytes allocated for KV vs the final KV) is evidence.

Severity follows the waste's share of the peak, but a transient below half of
the cache live at the peak (the layer-at-a-time DynamicCache) is at most medium:
it is the cost of transformers' default, not a doubled cache.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding, severity_for
from memwarden.trace.model import Action, Category, Trace
from memwarden.units import format_bytes

PATTERN = "kv-concat-growth"
CAT_OPS = frozenset({"aten::cat", "aten::concat", "aten::concatenate"})
# A cache outlives the module call that grew it, so temporaries (rotate_half's cat, attention
# scores) are not one. A cache grown outside any module and fed back into the model is tagged
# input: keep it.
_NOT_KV = np.array(
    [Category.WEIGHT, Category.BUFFER, Category.GRADIENT, Category.OPTIMIZER_STATE, Category.TEMPORARY], dtype=np.uint8
)
_LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def _wildcard(modules: list[str]) -> str:
    """'layers.0.attn', 'layers.1.attn' -> 'layers.*.attn'."""
    patterns = sorted({_LAYER_INDEX.sub("*", m) for m in modules})
    return patterns[0] if len(patterns) == 1 else ", ".join(patterns[:3]) + (" ..." if len(patterns) > 3 else "")


def _chains(trace: Trace, rows: np.ndarray, min_steps: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(axis, rows, lengths) of every growth run: >= min_steps distinct lengths along one axis."""
    e = trace.events
    runs: list[tuple[int, np.ndarray, np.ndarray]] = []
    if len(rows) == 0:
        return runs
    sids = np.unique(e["shape"][rows])
    shapes = [trace.shapes[int(u)] for u in sids]
    max_nd = max(len(sh) for sh in shapes)
    # per axis, for each shape id in sids: the id of the shape without that axis, and its length there
    key_of = np.full((max_nd, len(sids)), -1, dtype=np.int64)
    length_of = np.full((max_nd, len(sids)), -1, dtype=np.int64)
    key_ids: dict[tuple[int, ...], int] = {}
    for j, sh in enumerate(shapes):
        for axis in range(len(sh) - 1):  # the last axis is head_dim / features, never the sequence
            key_of[axis, j] = key_ids.setdefault((axis, *sh[:axis], *sh[axis + 1 :]), len(key_ids))
            length_of[axis, j] = sh[axis]
    ndim_of = np.array([len(sh) for sh in shapes], dtype=np.int64)
    row_shape = np.searchsorted(sids, e["shape"][rows])  # index into sids
    n_dtypes = len(trace.strings) + 2
    fam_key = ((e["module"][rows].astype(np.int64) + 1) * n_dtypes + e["dtype"][rows] + 1) * 64 + ndim_of[row_shape]
    order = np.argsort(fam_key, kind="stable")  # by family, in time order within one
    bounds = np.flatnonzero(np.diff(fam_key[order])) + 1
    for fam in np.split(order, bounds):
        fam_rows, fam_shape = rows[fam], row_shape[fam]
        ndim = int(ndim_of[fam_shape[0]])
        taken = np.zeros(len(fam_rows), dtype=bool)
        for axis in dict.fromkeys([ndim - 2, ndim - 3, *range(ndim - 1)]):
            if axis < 0 or taken.all():
                continue
            row_key, row_len = key_of[axis, fam_shape], length_of[axis, fam_shape]
            span = int(row_len.max()) + 1
            pairs = np.unique(row_key * span + row_len)  # distinct (key, length)
            keys, distinct = np.unique(pairs // span, return_counts=True)
            grown = keys[distinct >= min_steps]
            member = np.isin(row_key, grown) & ~taken
            if not member.any():
                continue
            taken |= member
            idx = np.flatnonzero(member)
            idx = idx[np.argsort(row_key[idx], kind="stable")]  # by key, in time order within a key
            for chain_idx in np.split(idx, np.flatnonzero(np.diff(row_key[idx])) + 1):
                chain, length = fam_rows[chain_idx], row_len[chain_idx]
                # a drop in length starts a new run (a new request, a reset cache)
                starts = np.flatnonzero(np.diff(length) < 0) + 1
                for run_rows, run_len in zip(np.split(chain, starts), np.split(length, starts), strict=True):
                    if len(np.unique(run_len)) >= min_steps:
                        runs.append((axis, run_rows, run_len))
    return runs


def detect(ctx: Context) -> list[Finding]:
    trace = ctx.trace
    n = trace.num_events
    if n == 0:
        return []
    min_steps = int(ctx.threshold(PATTERN, "min_steps", 4))
    high = float(ctx.threshold(PATTERN, "high", 0.2))
    medium = float(ctx.threshold(PATTERN, "medium", 0.05))
    e = trace.events
    dev = ctx.analysis.device
    is_cat = np.zeros(len(trace.strings) + 1, dtype=bool)
    for i, name in enumerate(trace.strings):
        is_cat[i] = name in CAT_OPS
    cand = (e["action"] == Action.ALLOC) & (e["device"] == dev) & is_cat[e["op"]] & ~np.isin(e["category"], _NOT_KV)
    cand &= e["shape"] >= 0
    rows = np.flatnonzero(cand)
    if len(rows) == 0:
        return []
    ndim = np.array([len(s) for s in trace.shapes] + [0], dtype=np.int64)
    rows = rows[ndim[e["shape"][rows]] >= 3]  # (.., T, hd): token ids and masks are not a KV cache
    runs = _chains(trace, rows, min_steps)
    if not runs:
        return []
    live = ctx.analysis.live_bytes
    p = int(np.argmax(live))
    peak_bytes = int(live[p])
    fi = ctx.analysis.free_index
    nbytes = e["nbytes"]

    by_where: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for axis, run, length in runs:
        r0 = int(run[0])
        module = trace.string(int(e["module"][r0])) or "(no module)"
        op = trace.string(int(e["op"][r0])) or "aten::cat"
        last = length == length.max()
        first = length == length.min()
        # A copy the next cat supersedes is freed by the one after it at the latest; one that lives on
        # is kept by something else (an old turn's output): retained-outputs', not this pattern's.
        two_longer = np.searchsorted(length, length + 2, side="left")  # lengths grow along the run
        after_next = np.where(two_longer < len(run), run[np.minimum(two_longer, len(run) - 1)], n)
        passing = fi[run] <= after_next
        alive = (run <= p) & (fi[run] > p) & passing
        transient = 0
        if alive.any():
            longest = length[alive].max()
            old = np.flatnonzero(alive & (length < longest))
            new_count = int(np.count_nonzero(alive & (length == longest)))
            old = old[np.argsort(-length[old], kind="stable")][:new_count]
            transient = int(nbytes[run[old]].sum())
        by_where[(_wildcard([module]), op)].append(
            {
                "module": module,
                "steps": int(len(np.unique(length)) - 1),
                "allocated": int(nbytes[run].sum()),
                "final": int(nbytes[run[last]].sum()),
                "first": int(nbytes[run[first]].sum()),
                "transient": transient,
                "live_at_peak": int(nbytes[run[alive]].sum()),
                "first_shape": list(trace.shapes[int(e["shape"][run[0]])]),
                "last_shape": list(trace.shapes[int(e["shape"][run[last][-1]])]),
                "axis": axis,
                "drop": run[(length < length.max()) & passing],
            }
        )

    findings = []
    for (where_module, op), chains in by_where.items():
        transient = sum(c["transient"] for c in chains)
        kv_live = sum(c["live_at_peak"] for c in chains)
        allocated = sum(c["allocated"] for c in chains)
        final = sum(c["final"] for c in chains)
        steps = max(c["steps"] for c in chains)
        per_step = sum((c["final"] - c["first"]) / c["steps"] for c in chains if c["steps"]) if chains else 0
        severity = severity_for(transient, peak_bytes, high=high, medium=medium)
        whole_cache = kv_live > 0 and transient >= 0.5 * (kv_live - transient)
        if severity == "high" and not whole_cache:
            severity = "medium"  # one layer at a time (DynamicCache): bounded, not a doubled cache
        evidence: dict[str, Any] = {
            "op": op,
            "chains": len(chains),
            "modules": sorted({c["module"] for c in chains})[:8],
            "decode_steps": steps,
            "kv_bytes_per_step": int(per_step),
            "final_kv_bytes": final,
            "kv_bytes_allocated": allocated,
            "churn_ratio": round(allocated / final, 1) if final else None,
            "transient_bytes_at_peak": transient,
            "kv_bytes_live_at_peak": kv_live,
            "whole_cache_doubled": whole_cache,
            "first_shape": chains[0]["first_shape"],
            "last_shape": chains[0]["last_shape"],
            "sequence_axis": chains[0]["axis"],
        }
        place = "in the code that calls the model" if where_module == "(no module)" else f"in {where_module}"
        fix = (
            f"Preallocate the KV cache instead of growing it with torch.cat {place} (transformers "
            f'StaticCache: generate(..., cache_implementation="static"), memwarden\'s paged KV cache, or in a '
            f"hand-written loop one (B, H, max_len, head_dim) buffer per layer written in place with "
            f"index_copy_ / slice assignment): saves the transient copy of {format_bytes(transient)} at peak and "
            f"{format_bytes(max(allocated - final, 0))} of allocation churn ({format_bytes(allocated)} allocated "
            f"for {format_bytes(final)} of cache over {steps} steps)."
        )
        findings.append(
            Finding(
                pattern=PATTERN,
                severity=severity,
                bytes_at_peak=kv_live,
                wasted_bytes=transient,
                where=f"{where_module} / {op}",
                evidence=evidence,
                fix=fix,
                change=Change(drop=np.concatenate([c["drop"] for c in chains])),
            )
        )
    return findings
