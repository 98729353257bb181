"""Memory limits checked against a Trace: the pure core of ``memwarden check`` and the pytest plugin.

A limit bounds one figure of a run. The figure is picked by a *scope* and a *measure*:

- the scope narrows which bytes count and when. A modality or a category keeps only the bytes
  attributed to it (``vision``: the vision tower's weights, activations and KV entries); a phase
  keeps only the moments inside that phase (``prefill``: the process's live bytes while prefill
  runs). Scopes combine: ``prefill.vision`` is the vision bytes alive during prefill. No scope is
  the whole process.
- the measure is ``peak`` (the most bytes alive at once, the figure an out-of-memory kill answers
  to) or ``allocated`` (bytes handed out over the run: the work a leak or a recompute adds, which
  a peak can hide).

"During a phase" means at the allocations made in that phase: live bytes only rise at an
allocation, so the highest of them is the phase's peak. (``summary``'s per-phase peak also reads the
moments a block of that phase is freed, later, in another phase, so it can be higher; never lower.) Everything is on the trace's primary device (``Analysis.device``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memwarden.analyze.analysis import Analysis
from memwarden.analyze.timeline import live_blocks_at
from memwarden.trace.model import Action, Category, Modality, Phase, Trace, enum_name
from memwarden.units import format_bytes, parse_bytes

__all__ = ["CheckResult", "Limit", "LineBytes", "Outcome", "check_limits", "measure", "parse_limit", "parse_scope"]

MEASURES = ("peak", "allocated")
_KINDS: dict[str, type[Phase] | type[Modality] | type[Category]] = {
    "phase": Phase,
    "modality": Modality,
    "category": Category,
}
_STARTS = (int(Action.ALLOC), int(Action.PREEXISTING), int(Action.MAP))
_RUN_ALLOCS = (int(Action.ALLOC), int(Action.MAP))  # handed out during the run (not alive before it)


@dataclass(frozen=True, kw_only=True)
class Limit:
    """At most ``max_bytes`` of ``measure`` within the scope (None: not narrowed on that axis)."""

    max_bytes: int
    measure: str = "peak"
    phase: str | None = None
    modality: str | None = None
    category: str | None = None

    def __post_init__(self) -> None:
        if self.measure not in MEASURES:
            raise ValueError(f"unknown measure {self.measure!r} (valid: {', '.join(MEASURES)})")
        for kind, value in (("phase", self.phase), ("modality", self.modality), ("category", self.category)):
            if value is not None and value not in _names(kind):
                raise ValueError(f"unknown {kind} {value!r} (valid: {', '.join(_names(kind))})")

    @property
    def scope(self) -> str:
        """``prefill.vision``, or ``process`` for the whole run."""
        parts = [p for p in (self.phase, self.modality, self.category) if p is not None]
        return ".".join(parts) or "process"

    @property
    def label(self) -> str:
        """``peak prefill.vision``: what the limit bounds, in the words a breach line uses."""
        return f"{self.measure} {self.scope}"

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, **self.__dict__}


@dataclass(frozen=True, kw_only=True)
class LineBytes:
    """Bytes one source line (``file:line:function``) holds at the peak or allocated over the run."""

    line: str
    nbytes: int


@dataclass(frozen=True, kw_only=True)
class Outcome:
    limit: Limit
    measured_bytes: int
    at_time_us: int  # when the peak was reached, from the trace's start (-1: allocated, or never)
    top_lines: tuple[LineBytes, ...] = ()

    @property
    def ok(self) -> bool:
        return self.measured_bytes <= self.limit.max_bytes

    @property
    def over_bytes(self) -> int:
        return self.measured_bytes - self.limit.max_bytes

    def message(self) -> str:
        """One line: ``peak prefill.vision 1.6 MiB > limit 1.5 MiB (+104.0 KiB, 6.9%)``."""
        limit = self.limit
        verdict = ">" if not self.ok else "<="
        text = f"{limit.label} {format_bytes(self.measured_bytes)} {verdict} limit {format_bytes(limit.max_bytes)}"
        if not self.ok:
            share = f", {100 * self.over_bytes / limit.max_bytes:.1f}%" if limit.max_bytes else ""
            text += f" (+{format_bytes(self.over_bytes)}{share})"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "limit": self.limit.to_json(),
            "measured_bytes": self.measured_bytes,
            "at_time_us": self.at_time_us,
            "ok": self.ok,
            "message": self.message(),
            "top_lines": [{"line": x.line, "nbytes": x.nbytes} for x in self.top_lines],
        }


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    outcomes: tuple[Outcome, ...] = field(default_factory=tuple)

    @property
    def breaches(self) -> tuple[Outcome, ...]:
        return tuple(o for o in self.outcomes if not o.ok)

    @property
    def ok(self) -> bool:
        return not self.breaches

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "outcomes": [o.to_json() for o in self.outcomes]}


def _names(kind: str) -> list[str]:
    return [enum_name(m) for m in _KINDS[kind]]


def parse_scope(text: str) -> dict[str, str]:
    """``prefill.vision`` -> {phase: prefill, modality: vision}. Parts are joined by ``.`` or ``+``;
    a part is a phase, modality or category name, or ``kind:name`` where a name is ambiguous
    (``other`` is both a phase and a category). ``process`` (or nothing) is the whole run."""
    scope: dict[str, str] = {}
    text = text.strip().lower()
    if text in ("", "process", "total"):
        return scope
    for part in re.split(r"[.+]", text):
        part = part.strip()
        if ":" in part:
            kind, name = (s.strip() for s in part.split(":", 1))
            if kind not in _KINDS:
                raise ValueError(f"unknown scope kind {kind!r} in {text!r} (valid: phase, modality, category)")
            kinds = [kind] if name in _names(kind) else []
        else:
            name = part
            kinds = [k for k in _KINDS if name in _names(k)]
        if not kinds:
            valid = "; ".join(f"{k}: {', '.join(_names(k))}" for k in _KINDS)
            raise ValueError(f"unknown scope {part!r} in {text!r} (valid names: {valid})")
        if len(kinds) > 1:
            raise ValueError(f"{name!r} is ambiguous: write {' or '.join(f'{k}:{name}' for k in kinds)}")
        if kinds[0] in scope:
            raise ValueError(f"{text!r} names two {kinds[0]}s")
        scope[kinds[0]] = name
    return scope


def parse_limit(text: str, measure: str = "peak") -> Limit:
    """``prefill=1.2GiB``, ``prefill.vision=600MiB`` or ``allocated:vision=3GiB`` (the measure
    first, else ``measure``) -> a Limit. Raises ValueError with the accepted forms."""
    if "=" not in text:
        raise ValueError(f"not a limit: {text!r} (expected SCOPE=SIZE, e.g. prefill=1.2GiB or vision=600MiB)")
    key, size = text.rsplit("=", 1)
    head, _, rest = key.partition(":")
    if head.strip().lower() in MEASURES and rest:
        measure, key = head.strip().lower(), rest
    scope = parse_scope(key)
    return Limit(max_bytes=parse_bytes(size), measure=measure, **scope)


def _selected(trace: Trace, limit: Limit, device: int) -> np.ndarray:
    """Rows whose bytes count for ``limit``'s modality and category, on ``device``."""
    ev = trace.events
    keep = ev["device"] == device
    if limit.modality is not None:
        keep &= ev["modality"] == int(Modality[limit.modality.upper()])
    if limit.category is not None:
        keep &= ev["category"] == int(Category[limit.category.upper()])
    return keep


def _in_phase(trace: Trace, limit: Limit) -> np.ndarray:
    if limit.phase is None:
        return np.ones(trace.num_events, dtype=bool)
    return np.asarray(trace.events["phase"] == int(Phase[limit.phase.upper()]))


def measure(trace: Trace, limit: Limit, *, analysis: Analysis | None = None, top: int = 3) -> Outcome:
    """The figure ``limit`` bounds, with the source lines that hold most of it (when the trace
    recorded lines; else none)."""
    analysis = analysis or Analysis(trace)
    device = analysis.device
    ev = trace.events
    n = trace.num_events
    counted = _selected(trace, limit, device)
    action = ev["action"]
    t0 = int(ev["time_us"][0]) if n else 0
    if limit.measure == "allocated":
        rows = np.flatnonzero(counted & np.isin(action, _RUN_ALLOCS) & _in_phase(trace, limit))
        total = int(ev["nbytes"][rows].sum())
        return Outcome(limit=limit, measured_bytes=total, at_time_us=-1, top_lines=_top_lines(trace, rows, top))
    live = np.cumsum(np.where(counted, analysis.signed_bytes, 0))
    moments = np.flatnonzero(np.isin(action, _STARTS) & (ev["device"] == device) & _in_phase(trace, limit))
    if not len(moments):
        return Outcome(limit=limit, measured_bytes=0, at_time_us=-1)
    at = int(moments[int(np.argmax(live[moments]))])
    peak = max(0, int(live[at]))
    blocks = live_blocks_at(trace, at, device, analysis.free_index)
    blocks = blocks[counted[blocks]]
    return Outcome(
        limit=limit,
        measured_bytes=peak,
        at_time_us=int(ev["time_us"][at]) - t0,
        top_lines=_top_lines(trace, blocks, top),
    )


def _top_lines(trace: Trace, rows: np.ndarray, top: int) -> tuple[LineBytes, ...]:
    lines = trace.events["line"][rows]
    known = lines >= 0
    if top <= 0 or not known.any():
        return ()
    keys, inverse = np.unique(lines[known], return_inverse=True)
    sums = np.bincount(inverse, weights=trace.events["nbytes"][rows][known].astype(np.float64))
    order = np.argsort(-sums, kind="stable")[:top]
    return tuple(LineBytes(line=trace.strings[int(keys[i])], nbytes=int(sums[i])) for i in order)


def check_limits(trace: Trace, limits: list[Limit], *, analysis: Analysis | None = None, top: int = 3) -> CheckResult:
    """Every limit measured against ``trace``; ``result.breaches`` are the ones exceeded."""
    analysis = analysis or Analysis(trace)
    return CheckResult(outcomes=tuple(measure(trace, lim, analysis=analysis, top=top) for lim in limits))
