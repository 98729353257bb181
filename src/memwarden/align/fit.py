"""Online straight-line fit of timestamps against a counter (samples or frame indices).

Welford-style running means and co-moments rather than raw sums: an hour of 16 kHz audio puts the
sample counter at 5.8e7, whose squares summed over 1e5 chunks lose every significant digit of
``Sxx - Sx**2 / n`` in float64; the centred co-moments do not.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LineFit:
    """``t_s ≈ intercept_s + slope_s * x`` by least squares over every point pushed so far.

    Least squares is unbiased for any zero-mean timestamp jitter and only shifts the intercept by
    the mean of a one-sided delivery latency; the slope (the clock's period, hence its drift) is
    what the aligner needs most precisely, and its error falls as ``jitter / (span * sqrt(n))``.
    """

    prior_slope_s: float
    max_deviation: float = 0.01  # crystals are within a few hundred ppm; 1% bounds a wild early fit
    min_points: int = 10  # two or three jittered points make a slope that can be off by 25%
    count: int = 0
    mean_x: float = 0.0
    mean_t_s: float = 0.0
    comoment_xx: float = 0.0
    comoment_xt: float = 0.0

    def push(self, x: float, t_s: float) -> None:
        self.count += 1
        dx = x - self.mean_x
        self.mean_x += dx / self.count
        dt = t_s - self.mean_t_s
        self.mean_t_s += dt / self.count
        self.comoment_xx += dx * (x - self.mean_x)
        self.comoment_xt += dx * (t_s - self.mean_t_s)

    @property
    def slope_s(self) -> float:
        # Until enough points span some counter range the slope is noise: keep the nominal period,
        # and never trust one further from it than any real clock is.
        if self.count < self.min_points or self.comoment_xx <= 0.0:
            return self.prior_slope_s
        lo, hi = self.prior_slope_s * (1 - self.max_deviation), self.prior_slope_s * (1 + self.max_deviation)
        return min(max(self.comoment_xt / self.comoment_xx, lo), hi)

    def at(self, x: float) -> float:
        """The fitted time of counter value ``x``."""
        return self.mean_t_s + self.slope_s * (x - self.mean_x)

    def counter_at(self, t_s: float) -> float:
        """The (fractional) counter value at time ``t_s``: the inverse of ``at``."""
        return self.mean_x + (t_s - self.mean_t_s) / self.slope_s
