"""Online straight-line fit of timestamps against a counter (samples or frame indices).

Two estimates of the slope (the clock's period) are kept, and the data pick one:

- **Least squares** is the maximum-likelihood slope for Gaussian timestamp jitter: no estimator
  does better there, and its error falls as ``jitter * sqrt(12) / (span * sqrt(n))``.
- **The lower envelope** is the better one when every stamp is the capture time plus a delay that
  is never below some floor (a scheduler's wake-up latency, a USB frame's delivery): the stamps
  closest to the floor pin the line, and its error falls as ``jitter / (span * n)``, not as
  ``1 / sqrt(n)``. NTP and PTP servo loops use minimum filters for the same reason. Among lines
  lying under every point, the one with the largest mean (the smallest mean delay) is the hull
  edge above the mean counter value.

The floor is told apart from Gaussian noise by how far the lowest point lies below the mean, in
least-squares residual deviations: about 1.7 for uniform delays, 1.0 for exponential ones, but
3 or more for 750 or more Gaussian points (below 2.2 with probability ~3e-5 at 750). One early
stamp far below the rest pushes the ratio up and falls back to least squares, which it moves
only by its share of the sum.

Welford-style running means and co-moments rather than raw sums: an hour of 16 kHz audio puts the
sample counter at 5.8e7, whose squares summed over 1e5 chunks lose every significant digit of
``Sxx - Sx**2 / n`` in float64; the centred co-moments do not. The residual variance and the hull
use the stamp less the nominal period times the counter (``r``), a few seconds at most, so their
differences keep their digits too.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field


@dataclass
class LineFit:
    """``t_s ≈ intercept_s + slope_s * x`` over every point pushed so far, ``x`` increasing.

    The line passes through the points' centroid (so ``at`` is the mean stamp of a counter value,
    delay included, for either slope estimate: a delay shared by two streams cancels in their
    offset). ``slope_s`` is the least-squares slope, or the lower envelope's when the stamps show
    a floor (see the module docstring).
    """

    prior_slope_s: float
    max_deviation: float = 0.01  # crystals are within a few hundred ppm; 1% bounds a wild early fit
    min_points: int = 10  # two or three jittered points make a slope that can be off by 25%
    floor_min_points: int = 50  # the floor test needs enough points for the lowest to mean anything
    floor_ratio: float = 2.2  # (mean - lowest) / deviation below this: the stamps have a floor
    count: int = 0
    mean_x: float = 0.0
    mean_t_s: float = 0.0
    comoment_xx: float = 0.0
    comoment_xt: float = 0.0
    # r = (t - t0) - prior_slope_s * (x - x0): the stamp less its nominal time, from the first point
    mean_r_s: float = 0.0
    comoment_rr: float = 0.0
    comoment_xr: float = 0.0
    _x0: float = 0.0
    _t0_s: float = 0.0
    _hull_x: list[float] = field(default_factory=list)  # lower convex hull of (x - x0, r), by x
    _hull_r: list[float] = field(default_factory=list)
    _hull_edge: list[float] = field(default_factory=list)  # slope of the edge into each vertex
    _slope_s: float | None = None  # cached: ``at`` and ``counter_at`` run many times per push
    _floor_used: bool = False

    def push(self, x: float, t_s: float) -> None:
        if self.count == 0:
            self._x0, self._t0_s = x, t_s
        xr = x - self._x0
        r = (t_s - self._t0_s) - self.prior_slope_s * xr
        self.count += 1
        dx = x - self.mean_x
        self.mean_x += dx / self.count
        dt = t_s - self.mean_t_s
        self.mean_t_s += dt / self.count
        dr = r - self.mean_r_s
        self.mean_r_s += dr / self.count
        self.comoment_xx += dx * (x - self.mean_x)
        self.comoment_xt += dx * (t_s - self.mean_t_s)
        self.comoment_xr += dx * (r - self.mean_r_s)
        self.comoment_rr += dr * (r - self.mean_r_s)
        self._hull_push(xr, r)
        self._slope_s = None

    @property
    def slope_s(self) -> float:
        # Until enough points span some counter range the slope is noise: keep the nominal period,
        # and never trust one further from it than any real clock is.
        if self._slope_s is None:
            self._slope_s = self._fit_slope()
        return self._slope_s

    @property
    def floor_used(self) -> bool:
        """Whether ``slope_s`` is the lower envelope's (the stamps show a floor) now."""
        _ = self.slope_s
        return self._floor_used

    def at(self, x: float) -> float:
        """The fitted time of counter value ``x``."""
        return self.mean_t_s + self.slope_s * (x - self.mean_x)

    def counter_at(self, t_s: float) -> float:
        """The (fractional) counter value at time ``t_s``: the inverse of ``at``."""
        return self.mean_x + (t_s - self.mean_t_s) / self.slope_s

    # -- internals ---------------------------------------------------------------------------

    def _hull_push(self, x: float, r: float) -> None:
        hx, hr, he = self._hull_x, self._hull_r, self._hull_edge
        if hx and x <= hx[-1]:  # same counter value again: only a lower stamp can matter
            if r >= hr[-1]:
                return
            del hx[-1], hr[-1], he[-1]
        while len(hx) >= 2 and (hx[-1] - hx[-2]) * (r - hr[-2]) - (hr[-1] - hr[-2]) * (x - hx[-2]) <= 0.0:
            del hx[-1], hr[-1], he[-1]  # the last vertex is not below the chord: not on the hull
        he.append((r - hr[-1]) / (x - hx[-1]) if hx else -math.inf)
        hx.append(x)
        hr.append(r)

    def _fit_slope(self) -> float:
        if self.count < self.min_points or self.comoment_xx <= 0.0:
            self._floor_used = False
            return self.prior_slope_s
        ls_r = self.comoment_xr / self.comoment_xx  # least-squares slope of r: slope_s - prior
        envelope_r = self._floor_slope_r(ls_r)
        self._floor_used = envelope_r is not None
        slope = self.prior_slope_s + (envelope_r if envelope_r is not None else ls_r)
        lo, hi = self.prior_slope_s * (1 - self.max_deviation), self.prior_slope_s * (1 + self.max_deviation)
        return min(max(slope, lo), hi)

    def _floor_slope_r(self, ls_r: float) -> float | None:
        """The lower envelope's slope of r when the stamps have a floor, else None."""
        if self.count < self.floor_min_points:
            return None
        variance = (self.comoment_rr - self.comoment_xr * ls_r) / self.count
        if not variance > 0.0:
            return None
        hx, hr, he = self._hull_x, self._hull_r, self._hull_edge
        mean_x = self.mean_x - self._x0
        # The hull vertex lowest under the least-squares line: edges flatter than it lead down to it.
        low = bisect_left(he, ls_r) - 1
        lowest = (hr[low] - self.mean_r_s) - ls_r * (hx[low] - mean_x)
        if -lowest >= self.floor_ratio * math.sqrt(variance):
            return None
        edge = bisect_left(hx, mean_x)  # the hull edge above the mean counter value
        if not 0 < edge < len(hx):
            return None
        return he[edge]
