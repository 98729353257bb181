"""Timelines, peaks and breakdowns: pure numpy over a Trace.

Live bytes after event i = cumulative sum of +nbytes (ALLOC, PREEXISTING, MAP)
and -nbytes (FREE, UNMAP). FREE rows repeat their block's attribution, so the
live bytes of any category (or modality, phase, module) at event i is the same
cumulative sum restricted to that category.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from memwarden.analyze.lines import LineBytes, lines_of_rows
from memwarden.analyze.resident import resident_summary
from memwarden.trace.model import Action, Category, Modality, Phase, Trace, enum_name

_LABELS = {
    "category": [enum_name(c) for c in Category],
    "modality": [enum_name(m) for m in Modality],
    "phase": [enum_name(p) for p in Phase],
}


def primary_device(trace: Trace) -> int:
    """The device a summary talks about: the one named in metadata, else the busiest."""
    name = trace.metadata.get("device")
    if isinstance(name, str) and name in trace.devices:
        return trace.devices.index(name)
    if trace.num_events == 0:
        return 0
    peaks = [int(trace.live_bytes(d).max(initial=0)) for d in range(len(trace.devices))]
    return int(np.argmax(peaks))


def _device_mask(trace: Trace, device: int) -> np.ndarray:
    return trace.events["device"] == device


def breakdown_at(trace: Trace, index: int, by: str, device: int) -> dict[str, int]:
    """Live bytes per label of column ``by`` just after event ``index``."""
    if index < 0:
        return {}
    signed = trace.signed_bytes(device)[: index + 1]
    labels = trace.events[by][: index + 1]
    if by in _LABELS:
        names = _LABELS[by]
        sums = np.bincount(labels, weights=signed, minlength=len(names))
        return {names[i]: int(v) for i, v in enumerate(sums) if int(v) != 0}
    # string-table columns (module, op): group by index, -1 = unattributed
    uniq, inverse = np.unique(labels, return_inverse=True)
    sums = np.bincount(inverse, weights=signed)
    out: dict[str, int] = {}
    for key, value in zip(uniq, sums, strict=False):
        if int(value) != 0:
            out[trace.string(int(key)) or "(unattributed)"] = int(value)
    return out


def free_index(trace: Trace) -> np.ndarray:
    """For each event row, the row at which its block is freed (len(trace) if never)."""
    action = trace.events["action"]
    tensor = trace.events["tensor"]
    n = trace.num_events
    result = np.full(n, n, dtype=np.int64)
    frees = np.flatnonzero((action == Action.FREE) | (action == Action.UNMAP))
    starts = np.flatnonzero((action == Action.ALLOC) | (action == Action.PREEXISTING) | (action == Action.MAP))
    if len(frees) == 0 or len(starts) == 0:
        return result
    # Pair each start with the first free of the same tensor id after it.
    order = np.lexsort((frees, tensor[frees]))
    f_sorted_t = tensor[frees][order]
    f_sorted_i = frees[order]
    pos = np.searchsorted(f_sorted_t, tensor[starts], side="left")
    # advance past frees that come before the start (ids are unique per block in captures; guard anyway)
    valid = pos < len(f_sorted_t)
    valid[valid] &= f_sorted_t[pos[valid]] == tensor[starts][valid]
    result[starts[valid]] = f_sorted_i[pos[valid]]
    bad = valid.copy()
    bad[valid] = result[starts[valid]] < starts[valid]
    result[starts[bad]] = n
    return result


@dataclass(frozen=True)
class Site:
    module: str
    op: str
    category: str
    modality: str
    nbytes: int
    count: int


def live_blocks_at(trace: Trace, index: int, device: int, free_rows: np.ndarray | None = None) -> np.ndarray:
    """Rows of the ALLOC/PREEXISTING/MAP events whose blocks are live just after ``index``.

    ``free_rows``: the trace's ``free_index`` when the caller already has it (it is the costly part).
    """
    action = trace.events["action"]
    starts = (action == Action.ALLOC) | (action == Action.PREEXISTING) | (action == Action.MAP)
    rows = np.flatnonzero(starts[: index + 1] & _device_mask(trace, device)[: index + 1])
    freed_at = free_index(trace) if free_rows is None else free_rows
    return rows[freed_at[rows] > index]


def top_sites_at(
    trace: Trace,
    index: int,
    device: int,
    limit: int = 15,
    exclude: tuple[Category, ...] = (),
    free_rows: np.ndarray | None = None,
) -> list[Site]:
    """The allocation sites (module, op) holding the most bytes just after ``index``."""
    if index < 0:
        return []
    rows = live_blocks_at(trace, index, device, free_rows)
    e = trace.events
    if exclude:
        rows = rows[~np.isin(e["category"][rows], np.array(exclude, dtype=np.uint8))]
    groups: dict[tuple[int, int, int, int], list[int]] = {}
    for r in rows.tolist():
        key = (int(e["module"][r]), int(e["op"][r]), int(e["category"][r]), int(e["modality"][r]))
        acc = groups.setdefault(key, [0, 0])
        acc[0] += int(e["nbytes"][r])
        acc[1] += 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])[:limit]
    return [
        Site(
            module=trace.string(m) or "(no module)",
            op=trace.string(o) or "(unknown op)",
            category=_LABELS["category"][c],
            modality=_LABELS["modality"][mo],
            nbytes=nb,
            count=cnt,
        )
        for (m, o, c, mo), (nb, cnt) in ranked
    ]


@dataclass
class Summary:
    peak_bytes: int
    peak_time_us: int
    events: int
    by_category_at_peak: dict[str, int]
    by_modality_at_peak: dict[str, int]
    by_phase_peak: dict[str, int]
    weights_bytes: int
    weights_by_modality: dict[str, int]
    device: str
    file_backed_bytes_at_peak: int
    anonymous_peak_bytes: int
    duration_us: int
    top_sites_at_peak: list[Site] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    # The lines of the user's code holding the most at the peak ({file, line, function, nbytes, count}).
    top_lines_at_peak: list[LineBytes] = field(default_factory=list)
    # Traced against resident memory (memwarden trace's samples), None without samples.
    resident: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _file_backed_at(trace: Trace, index: int, device: int) -> int:
    if index < 0:
        return 0
    a = trace.events["action"][: index + 1]
    nb = trace.events["nbytes"][: index + 1]
    on = _device_mask(trace, device)[: index + 1]
    return int(nb[(a == Action.MAP) & on].sum() - nb[(a == Action.UNMAP) & on].sum())


def _top_sites(trace: Trace, index: int, device: int, top: int, free_rows: np.ndarray | None) -> list[Site]:
    """The heaviest sites overall plus the heaviest that are not weights (one weight per
    parameter would otherwise fill the list on any real model)."""
    free_rows = free_index(trace) if free_rows is None else free_rows  # both lists read it: pair once
    overall = top_sites_at(trace, index, device, top, free_rows=free_rows)
    others = top_sites_at(trace, index, device, top, exclude=(Category.WEIGHT, Category.BUFFER), free_rows=free_rows)
    merged = {(x.module, x.op, x.category, x.modality): x for x in overall + others}
    return sorted(merged.values(), key=lambda x: -x.nbytes)


def summary(trace: Trace, device: int | None = None, top: int = 15, free_rows: np.ndarray | None = None) -> Summary:
    """Peak, breakdowns at peak, per-phase peaks and weight bytes of a Trace.

    ``free_rows``: the trace's ``free_index`` when the caller already has it (``Analysis`` does).
    """
    dev = primary_device(trace) if device is None else device
    n = trace.num_events
    live = trace.live_bytes(dev) if n else np.zeros(0, np.int64)
    peak_index = int(np.argmax(live)) if n else -1
    peak_bytes = int(live[peak_index]) if n else 0
    times = trace.events["time_us"]

    by_phase: dict[str, int] = {}
    if n:
        on = _device_mask(trace, dev)
        phases = trace.events["phase"]
        for p in Phase:
            sel = on & (phases == p)
            if sel.any():
                by_phase[enum_name(p)] = int(live[sel].max())

    cat = trace.events["category"]
    is_weight = (cat == Category.WEIGHT) | (cat == Category.BUFFER)
    weights_live = np.cumsum(np.where(is_weight, trace.signed_bytes(dev), 0)) if n else np.zeros(0, np.int64)
    w_index = int(np.argmax(weights_live)) if n else -1
    weights_bytes = int(weights_live[w_index]) if n else 0
    weights_by_modality: dict[str, int] = {}
    if n and weights_bytes:
        signed = np.where(is_weight, trace.signed_bytes(dev), 0)[: w_index + 1]
        sums = np.bincount(trace.events["modality"][: w_index + 1], weights=signed, minlength=len(Modality))
        weights_by_modality = {enum_name(Modality(i)): int(v) for i, v in enumerate(sums) if int(v)}

    anon = trace.live_bytes(dev, include_file_backed=False) if n else np.zeros(0, np.int64)
    return Summary(
        peak_bytes=peak_bytes,
        peak_time_us=int(times[peak_index] - times[0]) if n else 0,
        events=n,
        by_category_at_peak=breakdown_at(trace, peak_index, "category", dev),
        by_modality_at_peak=breakdown_at(trace, peak_index, "modality", dev),
        by_phase_peak=by_phase,
        weights_bytes=weights_bytes,
        weights_by_modality=weights_by_modality,
        device=trace.devices[dev] if trace.devices else "cpu",
        file_backed_bytes_at_peak=_file_backed_at(trace, peak_index, dev),
        anonymous_peak_bytes=int(anon.max(initial=0)),
        duration_us=int(times[-1] - times[0]) if n else 0,
        top_sites_at_peak=_top_sites(trace, peak_index, dev, top, free_rows) if n else [],
        metadata=dict(trace.metadata),
        top_lines_at_peak=lines_of_rows(trace, live_blocks_at(trace, peak_index, dev, free_rows), top) if n else [],
        resident=resident_summary(trace.metadata),
    )


@dataclass
class Timeline:
    """A downsampled stacked timeline: ``series[label][k]`` live bytes at ``time_us[k]``."""

    by: str
    time_us: np.ndarray
    series: dict[str, np.ndarray]
    total: np.ndarray

    def to_json(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "time_us": self.time_us.tolist(),
            "series": {k: v.tolist() for k, v in self.series.items()},
            "total": self.total.tolist(),
        }


def timeline(trace: Trace, by: str = "category", max_points: int = 2000, device: int | None = None) -> Timeline:
    """Live bytes over time stacked by ``by`` (category, modality or phase).

    Downsampling keeps, for each bucket of events, the event where the total is
    highest, so the peak always survives.
    """
    if by not in _LABELS:
        raise ValueError(f"timeline by {by!r}: expected one of {sorted(_LABELS)}")
    dev = primary_device(trace) if device is None else device
    n = trace.num_events
    names = _LABELS[by]
    if n == 0:
        empty = np.zeros(0, np.int64)
        return Timeline(by, empty, {}, empty)
    signed = trace.signed_bytes(dev)
    total = np.cumsum(signed)
    # One row per timestamp, the one with the highest total: rows sharing a timestamp
    # (preexisting tensors all sit at t=0) must not be drawn as if the first one held.
    t_all = trace.events["time_us"]
    candidates = np.arange(n)
    if n > 1 and np.any(t_all[1:] == t_all[:-1]):
        order = np.lexsort((-total, t_all))
        first = np.ones(n, dtype=bool)
        first[1:] = t_all[order][1:] != t_all[order][:-1]
        candidates = np.sort(order[first])
    m = len(candidates)
    if m <= max_points:
        picks = candidates
    else:
        edges = np.linspace(0, m, max_points).astype(np.int64)  # max_points - 1 buckets + the first row
        cand_total = total[candidates]
        picks = np.array(
            [
                candidates[lo + int(np.argmax(cand_total[lo:hi]))]
                for lo, hi in zip(edges[:-1], edges[1:], strict=True)
                if hi > lo
            ],
            dtype=np.int64,
        )
        picks = np.unique(np.concatenate([candidates[:1], picks]))  # the plot starts where the trace starts
    labels = trace.events[by]
    series: dict[str, np.ndarray] = {}
    for i, name in enumerate(names):
        sel = labels == i
        if not sel.any():
            continue
        cum = np.cumsum(np.where(sel, signed, 0))[picks]
        if cum.any():
            series[name] = cum
    t = trace.events["time_us"]
    return Timeline(by, (t[picks] - t[0]).astype(np.int64), series, total[picks])
