"""fragmentation, the evidence across steps: what mixing shapes costs the caching allocator.

Peak reserved against peak allocated (``fragmentation``'s first rule) mostly measures segment
rounding on small runs: on the real-world corpus a 7 MiB tiny-model trace reserves 1.3-3x what it
allocates whether its shapes vary or not (``docs/diagnose-accuracy.md``, calibration). What
varying shapes really cost is reserved memory no single step needs: each window of the run (the
part before the first model call, every model call, every gap between calls: backward and
optimizer) is replayed alone through the allocator model, on a fresh allocator holding what was
live at the window's start (the weights, kept outputs, saved activations). The largest of those is
what the run needs; the whole run's peak reserved above it is what the sequence of different
shapes stranded in cached blocks of the wrong sizes (``excess_bytes``). A run of one repeated
shape reserves exactly what its largest step needs (excess 0), and so does any run whose graphs or
caches grow, since what grew is live at the next window's start.

Cost: one replay per window replayed; only the ``max_windows`` windows with the most bytes live
inside them are replayed (the largest need comes from the fullest window).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memwarden.analyze.analysis import Analysis
from memwarden.plan.allocator.config import AllocatorConfig
from memwarden.plan.replay import replay
from memwarden.trace.model import Action, Trace

__all__ = ["StepNeed", "step_need"]


@dataclass(frozen=True, kw_only=True)
class StepNeed:
    """The largest reserved peak of a window replayed alone, and which window it was."""

    need_bytes: int  # the most any window reserves alone (its live state at start included)
    windows: int  # windows in the run (before the first step, steps, gaps between steps)
    replayed: int  # windows replayed (the fullest ones)
    neediest_start_us: int  # the window that needs the most


def _windows(analysis: Analysis) -> list[tuple[int, int]]:
    """Trace row ranges ``[lo, hi)``: before the first step, each step, each gap, after the last."""
    trace = analysis.trace
    times = trace.events["time_us"]
    cuts = [0]
    for s in analysis.steps:
        cuts += [
            int(np.searchsorted(times, s.start_us, side="left")),
            int(np.searchsorted(times, s.end_us, side="right")),
        ]
    cuts.append(trace.num_events)
    cuts = sorted(set(cuts))
    return [(lo, hi) for lo, hi in zip(cuts[:-1], cuts[1:], strict=True) if hi > lo]


def _sub(trace: Trace, rows: np.ndarray) -> Trace:
    return Trace(
        events={k: v[rows] for k, v in trace.events.items()},
        spans={},
        strings=trace.strings,
        shapes=trace.shapes,
        devices=trace.devices,
        metadata={},
    )


def step_need(analysis: Analysis, max_windows: int = 8) -> StepNeed | None:
    """What the neediest window of the run reserves alone; None without two steps to compare."""
    trace = analysis.trace
    if len(analysis.steps) < 2 or trace.num_events == 0:
        return None
    ev = trace.events
    action = ev["action"]
    dev = analysis.device
    live = analysis.live_bytes
    free_rows = analysis.free_index
    starts = np.flatnonzero(((action == Action.ALLOC) | (action == Action.PREEXISTING)) & (ev["device"] == dev))
    windows = _windows(analysis)
    fullest = sorted(windows, key=lambda w: -int(live[w[0] : w[1]].max()))[:max_windows]
    need, neediest = 0, 0
    for lo, hi in fullest:
        before = starts[(starts < lo) & (free_rows[starts] >= lo)]  # live at the window's start
        rows = np.concatenate([before, np.arange(lo, hi)])
        reserved = replay(_sub(trace, rows), AllocatorConfig(), device=dev).peak_reserved_bytes
        if reserved > need:
            need, neediest = int(reserved), int(ev["time_us"][lo])
    return StepNeed(need_bytes=need, windows=len(windows), replayed=len(fullest), neediest_start_us=neediest)
