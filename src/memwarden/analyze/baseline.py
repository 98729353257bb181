"""Two traces compared: did memory grow, where, and by how much? One comparison, two views.

The runs are aligned by name, not by time: each trace is reduced to figures keyed by what they
measure (``(kind, key)``: the process, a phase, a module path, a label), and the figures with
equal keys are paired by :func:`align` into :class:`Delta` values. Two runs of one model differ in
timing and in tensor ids, never in their phases or module paths, so the keys line up even when the
schedules do not.

Figures over the run (:func:`figures`, ``memwarden check --baseline``):

- ``process``: the peak of live bytes.
- ``phase``: the peak while each phase runs (as ``memwarden check`` counts it).
- ``module``: the peak of the bytes each module path allocated and still holds (weights included).
- ``category`` / ``modality``: the peak of each label's live bytes.
- ``line``: the peak of the live bytes each user source line allocated (only when both traces
  recorded lines; ``file:line:function``).

Growth is gated on process, phase and module figures (where a regression is found and fixed);
category, modality and line deltas explain it.

Figures at the peak (:func:`figures_at_peak`, ``memwarden compare``: PyTorch eager against ONNX
Runtime, two ORT settings): ``total`` (the peak, the weights, the peak above the weights), the
bytes live at each trace's own peak by ``category``, ``modality`` and ``module`` (paths cut to a
depth), and each ``phase``'s peak. Both commands pair their figures with the same :func:`align`
and report the same :class:`Comparison`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memwarden.analyze.analysis import Analysis
from memwarden.analyze.timeline import breakdown_at
from memwarden.trace.model import Action, Category, Modality, Phase, Trace, enum_name

__all__ = [
    "GATED",
    "Comparison",
    "Delta",
    "Figures",
    "align",
    "compare_at_peak",
    "compare_traces",
    "figures",
    "figures_at_peak",
    "growth_breaches",
]

GATED = ("process", "phase", "module")
Figures = dict[tuple[str, str], int]  # (kind, key) -> bytes
_ENUMS: dict[str, type[Phase] | type[Modality] | type[Category]] = {
    "phase": Phase,
    "category": Category,
    "modality": Modality,
}


@dataclass(frozen=True, kw_only=True)
class Delta:
    kind: str  # process | phase | module | category | modality | line
    key: str  # the phase, module path, label or line; "process" for the process
    old_bytes: int
    new_bytes: int

    @property
    def delta_bytes(self) -> int:
        return self.new_bytes - self.old_bytes

    @property
    def growth(self) -> float:
        """new / old - 1; inf when something appears that the baseline did not have."""
        if self.old_bytes <= 0:
            return 0.0 if self.new_bytes <= 0 else float("inf")
        return self.new_bytes / self.old_bytes - 1.0

    @property
    def name(self) -> str:
        return "process" if self.kind == "process" else f"{self.kind} {self.key}"

    def to_json(self) -> dict[str, Any]:
        growth = self.growth
        return {
            "kind": self.kind,
            "key": self.key,
            "old_bytes": self.old_bytes,
            "new_bytes": self.new_bytes,
            "delta_bytes": self.delta_bytes,
            "growth": growth if growth != float("inf") else None,
        }


@dataclass(frozen=True, kw_only=True)
class Comparison:
    deltas: tuple[Delta, ...] = field(default_factory=tuple)  # every aligned figure, in kind order
    has_lines: bool = False  # both traces recorded source lines

    def of(self, kind: str) -> list[Delta]:
        return [d for d in self.deltas if d.kind == kind]

    @property
    def old_peak_bytes(self) -> int:
        return next((d.old_bytes for d in self.deltas if d.kind == "process"), 0)

    def to_json(self) -> dict[str, Any]:
        return {"has_lines": self.has_lines, "deltas": [d.to_json() for d in self.deltas]}


def _group_peaks(trace: Trace, keys: np.ndarray, signed: np.ndarray) -> dict[int, int]:
    """Per key: the peak of the cumulative bytes of that key's rows (rows in time order).

    One stable sort by key, then a cumulative sum restarted at each group: O(n log n) for any
    number of keys (modules, lines), where one cumulative sum per key would be O(n * keys)."""
    if not len(keys):
        return {}
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    running = np.cumsum(signed[order])
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    before = np.r_[0, running[starts[1:] - 1]] if len(starts) > 1 else np.zeros(1, np.int64)
    group_of = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(order)]))
    live = running - before[group_of]
    peaks = np.maximum.reduceat(live, starts)
    return {int(k): max(0, int(p)) for k, p in zip(sorted_keys[starts], peaks, strict=True)}


def figures(trace: Trace, analysis: Analysis | None = None) -> Figures:
    """The trace reduced to ``{(kind, key): bytes}`` (see the module docstring)."""
    analysis = analysis or Analysis(trace)
    ev = trace.events
    signed = analysis.signed_bytes
    live = analysis.live_bytes
    out: Figures = {("process", "process"): int(live.max(initial=0))}
    starts = np.isin(ev["action"], [int(Action.ALLOC), int(Action.PREEXISTING), int(Action.MAP)])
    starts &= ev["device"] == analysis.device
    for phase in Phase:
        moments = starts & (ev["phase"] == int(phase))
        if moments.any():
            out[("phase", enum_name(phase))] = int(live[moments].max())
    for kind, enum in _ENUMS.items():
        if kind == "phase":
            continue
        for value, peak in _group_peaks(trace, ev[kind].astype(np.int64), signed).items():
            if peak:
                out[(kind, enum_name(enum(value)))] = peak
    for value, peak in _group_peaks(trace, ev["module"].astype(np.int64), signed).items():
        name = trace.string(value)
        out[("module", "(no module)" if name is None else name or "(root)")] = peak
    if (ev["line"] >= 0).any():
        lines = ev["line"].astype(np.int64)
        for value, peak in _group_peaks(trace, lines, signed).items():
            if value >= 0 and peak:
                out[("line", trace.strings[value])] = peak
    return out


_KIND_ORDER = ("process", "phase", "module", "category", "modality", "line")
_AT_PEAK_ORDER = ("total", "category", "modality", "phase", "module")
_TOTALS = ("peak", "weights", "peak above weights")


def align(old: Figures, new: Figures, order: Callable[[Delta], Any]) -> tuple[Delta, ...]:
    """Every figure of either side paired by ``(kind, key)``, sorted by ``order``; a figure one side
    lacks is 0 there (something that appeared, or went away)."""
    deltas = (Delta(kind=k[0], key=k[1], old_bytes=old.get(k, 0), new_bytes=new.get(k, 0)) for k in set(old) | set(new))
    return tuple(sorted(deltas, key=order))


def compare_traces(old: Trace, new: Trace) -> Comparison:
    """The figures over the run of both traces, aligned (``memwarden check --baseline``)."""
    a, b = figures(old), figures(new)
    has_lines = any(k[0] == "line" for k in a) and any(k[0] == "line" for k in b)
    deltas = align(a, b, order=lambda d: (_KIND_ORDER.index(d.kind), d.key))
    return Comparison(deltas=tuple(d for d in deltas if has_lines or d.kind != "line"), has_lines=has_lines)


def _module_at_peak(trace: Trace, analysis: Analysis, depth: int) -> dict[str, int]:
    """Bytes live at the trace's peak per module path cut to ``depth`` components."""
    live = analysis.live_bytes
    if not len(live):
        return {}
    by_module = breakdown_at(trace, int(np.argmax(live)), "module", analysis.device)
    out: dict[str, int] = {}
    for module, nbytes in by_module.items():
        key = ".".join(module.split(".")[:depth]) if module != "(unattributed)" else module
        out[key] = out.get(key, 0) + nbytes
    return out


def figures_at_peak(trace: Trace, analysis: Analysis | None = None, module_depth: int = 4) -> Figures:
    """The trace reduced to ``{(kind, key): bytes}`` at its peak (see the module docstring)."""
    analysis = analysis or Analysis(trace)
    s = analysis.summary
    out: Figures = dict(
        zip(
            (("total", t) for t in _TOTALS),
            (s.peak_bytes, s.weights_bytes, s.peak_bytes - s.weights_bytes),
            strict=True,
        )
    )
    for kind, values in (
        ("category", s.by_category_at_peak),
        ("modality", s.by_modality_at_peak),
        ("phase", s.by_phase_peak),
    ):
        out.update({(kind, k): int(v) for k, v in values.items()})
    out.update({("module", k): v for k, v in _module_at_peak(trace, analysis, module_depth).items()})
    return out


def _at_peak_order(d: Delta) -> tuple[int, int, str]:
    """Totals in their fixed order, labels and phases by name, modules heaviest first (by name on ties)."""
    if d.kind == "total":
        return (0, _TOTALS.index(d.key), "")
    rank = -max(d.old_bytes, d.new_bytes) if d.kind == "module" else 0
    return (_AT_PEAK_ORDER.index(d.kind), rank, d.key)


def compare_at_peak(old: Trace, new: Trace, *, module_depth: int = 4, top_modules: int = 15) -> Comparison:
    """The figures at the peak of both traces, aligned (``memwarden compare``); the ``top_modules``
    modules holding most in either trace."""
    a = figures_at_peak(old, module_depth=module_depth)
    b = figures_at_peak(new, module_depth=module_depth)
    deltas = align(a, b, order=_at_peak_order)
    modules = [d for d in deltas if d.kind == "module"][:top_modules]
    return Comparison(deltas=tuple(d for d in deltas if d.kind != "module") + tuple(modules))


def growth_breaches(comparison: Comparison, max_growth: float, min_delta_bytes: int | None = None) -> list[Delta]:
    """The gated figures (process, phase, module) that grew by more than ``max_growth`` (0.05 =
    5%) and by more than ``min_delta_bytes``: by default 1% of the baseline's peak, so that a
    module holding a few hundred bytes cannot fail a run by doubling them."""
    floor = comparison.old_peak_bytes // 100 if min_delta_bytes is None else min_delta_bytes
    return [d for d in comparison.deltas if d.kind in GATED and d.growth > max_growth and d.delta_bytes > floor]
