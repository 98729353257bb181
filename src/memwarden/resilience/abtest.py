"""Statistics for comparing two campaigns: Fisher's exact test, percentiles, bootstrap CIs.

Pure functions over plain numbers (numpy only). scipy is not a dependency of memwarden, so
Fisher's test is implemented here, exactly: the hypergeometric probabilities are ratios of
integer binomial coefficients, so tables are compared as exact integers and no tolerance is
needed (scipy needs a 1e-7 relative tolerance for the same comparison in floating point).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ConfidenceInterval", "bootstrap_ci", "bootstrap_diff_ci", "fisher_exact", "percentile"]


def fisher_exact(a_fail: int, a_ok: int, b_fail: int, b_ok: int) -> float:
    """Two-sided p-value of Fisher's exact test on the 2x2 table [[a_fail, a_ok], [b_fail, b_ok]].

    With the margins fixed, the number of failures in A is hypergeometric; the p-value is the
    total probability of every table no more likely than the observed one (the usual
    two-sided definition, as R's fisher.test and scipy.stats.fisher_exact use).
    """
    cells = (a_fail, a_ok, b_fail, b_ok)
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in cells):
        raise ValueError(f"a 2x2 table holds non-negative integers; got {cells}")
    n_a, n_fail, total = a_fail + a_ok, a_fail + b_fail, sum(cells)
    lo, hi = max(0, n_fail - (total - n_a)), min(n_a, n_fail)
    if lo == hi:
        return 1.0  # a single possible table (an empty row or column)

    def weight(k: int) -> int:  # comb(total, n_a) * P(A has k failures)
        return math.comb(n_fail, k) * math.comb(total - n_fail, n_a - k)

    observed = weight(a_fail)
    tail = sum(w for k in range(lo, hi + 1) if (w := weight(k)) <= observed)
    return min(1.0, tail / math.comb(total, n_a))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation as numpy's default; None when empty."""
    if not len(values):
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


@dataclass(frozen=True, kw_only=True)
class ConfidenceInterval:
    estimate: float
    low: float
    high: float
    confidence: float
    resamples: int

    def to_json(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "confidence": self.confidence}


def _resampled(
    values: np.ndarray, resamples: int, rng: np.random.Generator, stat: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    # (resamples, n) indices drawn in chunks so that 10k resamples of 10k values stay ~100 MiB
    out = np.empty(resamples)
    chunk = max(1, 2_000_000 // max(len(values), 1))
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        idx = rng.integers(0, len(values), size=(stop - start, len(values)))
        out[start:stop] = stat(values[idx])
    return out


def _q_stat(q: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda rows: np.percentile(rows, q, axis=-1)


def bootstrap_ci(
    values: Sequence[float], *, q: float = 50.0, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> ConfidenceInterval | None:
    """Percentile-bootstrap CI of the q-th percentile of ``values``; same seed, same interval."""
    data = np.asarray(values, dtype=np.float64)
    if not len(data):
        return None
    rng = np.random.default_rng(seed)
    stats = _resampled(data, resamples, rng, _q_stat(q))
    alpha = (1 - confidence) / 2
    return ConfidenceInterval(
        estimate=float(np.percentile(data, q)),
        low=float(np.quantile(stats, alpha)),
        high=float(np.quantile(stats, 1 - alpha)),
        confidence=confidence,
        resamples=resamples,
    )


def bootstrap_diff_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    q: float = 50.0,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> ConfidenceInterval | None:
    """CI of (q-th percentile of b) - (q-th percentile of a), resampling each side independently."""
    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if not len(xa) or not len(xb):
        return None
    rng = np.random.default_rng(seed)
    diff = _resampled(xb, resamples, rng, _q_stat(q)) - _resampled(xa, resamples, rng, _q_stat(q))
    alpha = (1 - confidence) / 2
    return ConfidenceInterval(
        estimate=float(np.percentile(xb, q) - np.percentile(xa, q)),
        low=float(np.quantile(diff, alpha)),
        high=float(np.quantile(diff, 1 - alpha)),
        confidence=confidence,
        resamples=resamples,
    )
