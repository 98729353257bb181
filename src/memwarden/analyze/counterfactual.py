"""A fix as a change to the run, and what that change saves: the trace replayed with it applied.

Every finding names a fix. What the fix does to the run's memory is not asserted but computed:
the detector says which blocks the fixed run would not make (``drop``: the retained outputs, the
second copy of the weights, the re-encoded image), which it would free sooner (``free_at``: the
old model released before the new one loads), and which it would make smaller (``scale``: fewer
media tokens, one logits row instead of the prompt's). ``saving`` replays the live-bytes curve of
the trace's device with those edits and returns two numbers a user can act on:

- ``saving_peak_bytes``: how much lower the peak would be (the peak may move to another moment);
- ``saving_allocated_bytes``: the bytes the fixed run no longer allocates over the run (work not
  done), whether or not they were live at the peak.

The replay is exact for the edits it is given (a cumulative sum over the event rows), so the only
approximation is the detector's model of what the fix changes; ``tests/test_counterfactual.py``
runs each pattern's planted case and its fixed twin and checks the prediction against the twin's
measured peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from memwarden.analyze.analysis import Analysis

__all__ = ["Change", "Saving", "saving", "union"]

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Change:
    """What a fix changes in the run, as rows of the trace (ALLOC/MAP/PREEXISTING rows).

    ``drop``: blocks the fixed run never makes. ``free_rows``/``free_at``: blocks the fixed run
    frees at event row ``free_at[i]`` instead of where the trace frees them (never later).
    ``scale_rows``/``scale``: blocks the fixed run makes ``scale[i]`` times as large (0..1).
    """

    drop: np.ndarray = field(default_factory=lambda: _EMPTY)
    free_rows: np.ndarray = field(default_factory=lambda: _EMPTY)
    free_at: np.ndarray = field(default_factory=lambda: _EMPTY)
    scale_rows: np.ndarray = field(default_factory=lambda: _EMPTY)
    scale: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))

    @property
    def empty(self) -> bool:
        return not (len(self.drop) or len(self.free_rows) or len(self.scale_rows))


def union(a: Change, b: Change) -> Change:
    """Both fixes applied: a block dropped by either is dropped, freed at the sooner of the two rows,
    scaled by the smaller factor."""
    rows, at = _least_per_row(np.concatenate([a.free_rows, b.free_rows]), np.concatenate([a.free_at, b.free_at]))
    s_rows, s = _least_per_row(np.concatenate([a.scale_rows, b.scale_rows]), np.concatenate([a.scale, b.scale]))
    return Change(
        drop=np.union1d(a.drop, b.drop).astype(np.int64),
        free_rows=rows,
        free_at=at.astype(np.int64),
        scale_rows=s_rows,
        scale=s.astype(np.float64),
    )


def _least_per_row(rows: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row once, with the least of its values."""
    rows = rows.astype(np.int64)
    order = np.lexsort((values, rows))
    rows, values = rows[order], values[order]
    first = np.ones(len(rows), dtype=bool)
    first[1:] = rows[1:] != rows[:-1]
    return rows[first], values[first]


@dataclass(frozen=True)
class Saving:
    saving_peak_bytes: int
    saving_allocated_bytes: int
    peak_after_bytes: int


def saving(analysis: Analysis, change: Change) -> Saving:
    """The run's peak and allocated bytes with ``change`` applied, against the trace's own."""
    live = analysis.live_bytes
    if not len(live):
        return Saving(0, 0, 0)
    trace, n = analysis.trace, analysis.trace.num_events
    on_dev = trace.events["device"] == analysis.device
    nbytes = trace.events["nbytes"].astype(np.int64)
    free = analysis.free_index
    delta = np.zeros(n + 1, dtype=np.int64)  # edits to the signed bytes; row n: "never freed"
    allocated = 0

    def cut(rows: np.ndarray, amount: np.ndarray, until: np.ndarray) -> None:
        # the block's bytes no longer live from its row until ``until`` (its free row, or n)
        np.add.at(delta, rows, -amount)
        np.add.at(delta, until, amount)

    drop = np.unique(change.drop.astype(np.int64))
    drop = drop[(drop >= 0) & (drop < n)]
    drop = drop[on_dev[drop]]
    cut(drop, nbytes[drop], free[drop])
    allocated += int(nbytes[drop].sum())

    rows, at = change.free_rows.astype(np.int64), change.free_at.astype(np.int64)
    keep = (rows >= 0) & (rows < n) & ~np.isin(rows, drop)
    rows, at = rows[keep], at[keep]
    keep = on_dev[rows]
    rows, at = rows[keep], at[keep]
    at = np.maximum(at, rows + 1)
    sooner = at < free[rows]
    rows, at = rows[sooner], at[sooner]
    np.add.at(delta, at, -nbytes[rows])
    np.add.at(delta, free[rows], nbytes[rows])

    rows, factor = change.scale_rows.astype(np.int64), change.scale.astype(np.float64)
    keep = (rows >= 0) & (rows < n) & ~np.isin(rows, drop)
    rows, factor = rows[keep], np.clip(factor[keep], 0.0, 1.0)
    keep = on_dev[rows]
    rows, factor = rows[keep], factor[keep]
    less = np.round(nbytes[rows] * (1.0 - factor)).astype(np.int64)
    cut(rows, less, free[rows])
    allocated += int(less.sum())

    after = live + np.cumsum(delta[:n])
    peak_before, peak_after = int(live.max()), int(after.max())
    return Saving(max(0, peak_before - peak_after), max(0, allocated), peak_after)
