"""The thresholds a user may set for the pattern detectors, and the check of a thresholds file.

``diagnose --config FILE`` reads ``[thresholds.<pattern-id>] name = value`` tables. Each value is
checked here once, before any detector runs: a name no detector reads, a value of the wrong type
(``"lots"``, ``true``), NaN or infinity, or a number outside its range is one ``ValueError`` naming
the table and the key. The detectors then convert without surprises (``int(x)`` of a string or of
``inf`` would raise deep inside a detector; ``bins = 1e30`` would ask numpy for 10^30 edges).

Every ``ctx.threshold(PATTERN, name, default)`` in ``analyze/patterns/`` has an entry below
(``tests/test_fuzz_commands.py`` reads the detectors' source to keep the two in step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

_BIG = 2**62  # bytes, events, tokens: any real count is far below


@dataclass(frozen=True, kw_only=True)
class Threshold:
    integer: bool  # an int (an integral float such as 4.0 is accepted) or any finite number
    lo: float
    hi: float


def _fraction() -> Threshold:
    return Threshold(integer=False, lo=0.0, hi=1.0)


def _count(lo: int = 0, hi: int = _BIG) -> Threshold:
    return Threshold(integer=True, lo=lo, hi=hi)


THRESHOLDS: dict[str, dict[str, Threshold]] = {
    # min_work_peaks: a finding that lowers no peak is kept when its fix saves this many peaks of allocation
    "all": {"min_waste_fraction": _fraction(), "min_work_peaks": Threshold(integer=False, lo=0.0, hi=1e9)},
    "alignment-padding": {"min_ratio": Threshold(integer=False, lo=0.0, hi=1e6)},
    "kv-reprefill": {"min_prefix_tokens": _count(), "high": _fraction(), "medium": _fraction()},
    "kv-concat-growth": {"min_steps": _count(lo=1), "high": _fraction(), "medium": _fraction()},
    "graph-retention": {
        "retained_fraction": _fraction(),
        "min_graphs_alive": _count(lo=1),
        "min_modules_without_backward": _count(),
    },
    "dequant-temporaries": {"min_blocks": _count(lo=1), "min_weight_bytes": _count(), "min_widened_share": _fraction()},
    "fragmentation": {
        "min_overhead_fraction": _fraction(),
        "min_unused_bytes": _count(),
        "max_replay_events": _count(lo=1),
        "max_split_size_mb": _count(hi=2**30),  # 0: chosen from the trace
        "min_excess_fraction": Threshold(integer=False, lo=0.0, hi=1e6),
        "min_excess_bytes": _count(),
        "max_windows": _count(lo=1),
    },
    "load-spike": {"min_ratio": Threshold(integer=False, lo=0.0, hi=1e6), "min_share_of_weights": _fraction()},
    "vision-token-dominance": {},
    "retained-outputs": {"min_iterations": _count(lo=1)},
    "two-models-alive": {"min_old_share": _fraction()},
    "full-logits": {"min_positions": _count(lo=1)},
    "request-multiplier": {},
    "untracked-host-memory": {
        "min_bytes": _count(),
        "min_share": Threshold(integer=False, lo=0.0, hi=1e6),
        "min_blocks": _count(lo=1),
        "min_whole_bytes": _count(),  # data held whole while the model reads pieces (_numpy_whole)
        "min_numpy_share": _fraction(),
        "min_pieces": Threshold(integer=False, lo=1.0, hi=1e6),
    },
    # bins cut the run into equal parts; each one is an array the detector builds
    "unbounded-growth": {
        "bins": _count(lo=1, hi=1000),
        "min_bins": _count(lo=1, hi=1000),
        "min_blocks": _count(),
        "bound_iterations": _count(lo=1),  # the size of the bounded container the fix is computed for
    },
}


def check_thresholds(table: Any, source: str = "thresholds") -> dict[str, dict[str, int | float]]:
    """``table`` (``{pattern: {name: value}}``) checked against ``THRESHOLDS``; ValueError naming
    the first bad entry. Returns the values as plain ints and floats."""
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise ValueError("expected [thresholds.<pattern-id>] tables")
    unknown = sorted(str(p) for p in table if p not in THRESHOLDS)
    if unknown:
        raise ValueError(f"unknown pattern ids in thresholds: {unknown} (known: {sorted(THRESHOLDS)})")
    checked: dict[str, dict[str, int | float]] = {}
    for pattern, values in table.items():
        known = THRESHOLDS[pattern]
        checked[pattern] = {}
        for name, value in values.items():
            where = f"{source}.{pattern}.{name}"
            if name not in known:
                raise ValueError(f"{where}: unknown threshold (known for {pattern}: {', '.join(sorted(known))})")
            checked[pattern][name] = _value(where, value, known[name])
    return checked


def _value(where: str, value: Any, rule: Threshold) -> int | float:
    kind = "an integer" if rule.integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: expected {kind} in [{rule.lo:g}, {rule.hi:g}], got {str(value)[:40]!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: expected {kind} in [{rule.lo:g}, {rule.hi:g}], got {value}")
    if rule.integer and isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{where}: expected an integer, got {value}")
    if not rule.lo <= value <= rule.hi:
        raise ValueError(f"{where}: {str(value)[:40]} is out of range [{rule.lo:g}, {rule.hi:g}]")
    return int(value) if rule.integer else float(value)
