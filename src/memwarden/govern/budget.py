"""The safe memory budget of a governed session, recalibrated from telemetry.

A :class:`BudgetController` turns each :class:`~memwarden.govern.telemetry.TelemetrySample`
into ``budget_bytes``: the memory the session may hold. Three layers, each with one job:

1. **Smoothing.** The controller keeps a sliding window (``window_s``) per signal. Memory the
   session could reach (available + what it already holds) is taken at its *minimum* over the
   window and projected forward along its falling trend to the end of one hysteresis hold,
   because a budget that is held for ``hysteresis_s`` must still be safe at the end of it.
   Temperature, power and frame rate are averaged over the window so one noisy reading does
   not move the budget. A signal missing from a sample keeps its last value.
2. **Policy.** A pure function of those smoothed :class:`Signals` gives the *target*.
   :class:`DefaultPolicy` multiplies the projected reachable memory, less the headroom and a
   noise margin (so ordinary jitter does not force drops), by per-signal
   weights, each with a floor (see its docstring for the numbers). Policies are pluggable
   (subclass :class:`BudgetPolicy`, :func:`register_policy`) and every parameter is a field.
3. **Hysteresis and safety.** Invariant, checked after every update::

       0 <= budget_bytes <= min(cap_bytes, max(0, A + U - H))

   with A the sample's ``mem_available_bytes`` (else the last one seen, else the device
   profile's usable bytes), U the ``in_use_bytes`` passed with it (0 in a replay), H
   ``min_headroom_bytes``. In a replay that reads ``budget <= available - min_headroom``
   whenever available >= min_headroom, else 0. With no memory signal at all the bound is the cap,
   and the target is the cap scaled by the policy's weights (temperature, power, fps). Those
   weights never take the target below ``floor_bytes`` (a session's working set: heat is a
   reason to serve leaner, not to refuse everything); the memory bound still can.

   Hysteresis: the budget changes at most once per ``hysteresis_s``: a change that is not
   *forced* comes at least ``hysteresis_s`` after the previous change (forced or not; the
   first sample's value counts as a change), and only if it moves the budget by at least
   ``max(min_change_bytes, min_change_fraction * budget)``. Safety wins over hysteresis: when
   the held budget exceeds the bound above, it drops at once to the target (a *forced* drop,
   flagged in the decision). Forced changes are always drops; increases always wait.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from memwarden.errors import InputError
from memwarden.govern.telemetry import TelemetrySample
from memwarden.units import parse_bytes

if TYPE_CHECKING:
    from memwarden.models.device_profile import DeviceProfile

__all__ = [
    "POLICIES",
    "BudgetController",
    "BudgetDecision",
    "BudgetPolicy",
    "DefaultPolicy",
    "FixedPolicy",
    "Signals",
    "make_policy",
    "register_policy",
    "replay",
]

_MIB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class Signals:
    """What a policy sees: the controller's smoothed view of the last ``window_s``."""

    t_s: float
    reachable_bytes: int | None  # available + in_use, min over the window; None: no memory signal
    predicted_reachable_bytes: int | None  # the same, projected to the end of one hysteresis hold
    mem_total_bytes: int | None
    temp_c: float | None  # mean over the window
    power_w: float | None  # mean over the window
    power_limit_w: float | None  # the latest the device reported
    fps: float | None  # mean over the window
    fps_best_recent: float | None  # highest fps sample within reference_window_s


@dataclass(frozen=True, kw_only=True)
class BudgetPolicy:
    """Parameters every policy shares (the controller reads them); ``target_bytes`` is the policy.

    The base policy's target is the projected reachable memory (less the noise margin) less
    the headroom, times the product of ``weights()`` (none here), floored at ``min_weight``.
    """

    name: ClassVar[str] = "base"
    min_headroom_bytes: int = 512 * _MIB  # never handed out: the OS, other apps, allocator slack
    hysteresis_s: float = 5.0  # at most one (unforced) change per this many seconds
    window_s: float = 10.0  # smoothing window
    reference_window_s: float = 60.0  # how far back "the best recent frame rate" looks
    min_change_bytes: int = 32 * _MIB  # smaller moves are noise, not worth a re-plan
    min_change_fraction: float = 0.05  # ... nor are moves under 5% of the budget
    granularity_bytes: int = _MIB  # budgets are whole MiB
    noise_margin_bytes: int = 64 * _MIB  # kept below the bound so jitter in available memory does not force drops
    noise_margin_sigmas: float = 3.0  # ... or this many standard deviations of that jitter, if more
    min_weight: float = 0.25  # the product of weights never goes below this

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{f.name} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"{f.name} must not be negative, got {value!r}")
        if self.granularity_bytes < 1:
            raise ValueError("granularity_bytes must be at least 1")
        if self.window_s <= 0:
            raise ValueError("window_s must be positive")
        if self.min_weight > 1:
            raise ValueError("min_weight must be at most 1")

    def weights(self, signals: Signals) -> dict[str, float]:
        """Per-signal factors in (0, 1]; their product scales the budget."""
        return {}

    def target_bytes(self, signals: Signals) -> int:
        reachable = signals.predicted_reachable_bytes
        if reachable is None:
            return 0
        product = math.prod(self.weights(signals).values())
        return int(max(0, reachable - self.min_headroom_bytes) * max(self.min_weight, min(1.0, product)))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **{f.name: getattr(self, f.name) for f in fields(self)}}


@dataclass(frozen=True, kw_only=True)
class DefaultPolicy(BudgetPolicy):
    """The documented default: a product of per-signal weights, each with a floor.

    - temperature: above ``temp_knee_c`` (45 °C) the budget falls ``temp_slope_per_c`` (2%)
      per degree, to at most ``temp_floor`` (half, reached at 70 °C). Hot silicon throttles
      clocks, each request lives longer and more of them overlap; a smaller budget admits fewer.
    - power: above ``power_knee_fraction`` (90%) of the power limit (``power_limit_w``, else
      the limit the device reports, else no effect) the budget falls ``power_slope`` (2×) the
      excess fraction, floor ``power_floor`` (0.7). At the cap clocks drop as they do when hot,
      and on unified-memory boards DRAM traffic is a large share of the power.
    - frame rate: when fps falls more than ``fps_tolerance`` (10%) below ``target_fps`` (else
      the best fps of the last ``reference_window_s``), the budget falls ``fps_slope`` (1×)
      the shortfall beyond the tolerance, floor ``fps_floor`` (0.75), so that the degradation
      ladder sheds work (fewer visual tokens, lower resolution) before frames are dropped.
      Without a target, a rate that stays low for ``reference_window_s`` becomes the norm.
    """

    name: ClassVar[str] = "default"
    temp_knee_c: float = 45.0
    temp_slope_per_c: float = 0.02
    temp_floor: float = 0.5
    power_limit_w: float | None = None
    power_knee_fraction: float = 0.9
    power_slope: float = 2.0
    power_floor: float = 0.7
    target_fps: float | None = None
    fps_tolerance: float = 0.1
    fps_slope: float = 1.0
    fps_floor: float = 0.75

    def weights(self, signals: Signals) -> dict[str, float]:
        out = {}
        if signals.temp_c is not None:
            excess_c = max(0.0, signals.temp_c - self.temp_knee_c)
            out["temp"] = max(self.temp_floor, 1.0 - self.temp_slope_per_c * excess_c)
        limit_w = self.power_limit_w or signals.power_limit_w
        if signals.power_w is not None and limit_w:
            excess = max(0.0, signals.power_w / limit_w - self.power_knee_fraction)
            out["power"] = max(self.power_floor, 1.0 - self.power_slope * excess)
        reference = self.target_fps or signals.fps_best_recent
        if signals.fps is not None and reference:
            shortfall = max(0.0, 1.0 - signals.fps / reference - self.fps_tolerance)
            out["fps"] = max(self.fps_floor, 1.0 - self.fps_slope * shortfall)
        return {k: min(1.0, v) for k, v in out.items()}


@dataclass(frozen=True, kw_only=True)
class FixedPolicy(BudgetPolicy):
    """A static budget (the baseline a governor is compared with), still under the safety bound."""

    name: ClassVar[str] = "fixed"
    budget_bytes: int = 0

    def target_bytes(self, signals: Signals) -> int:
        return self.budget_bytes


POLICIES: dict[str, type[BudgetPolicy]] = {"default": DefaultPolicy, "fixed": FixedPolicy}


def register_policy(cls: type[BudgetPolicy]) -> type[BudgetPolicy]:
    """Class decorator: make a policy available by its ``name`` (CLI ``--policy NAME``)."""
    POLICIES[cls.name] = cls
    return cls


def make_policy(name: str = "default", params: Mapping[str, Any] | None = None) -> BudgetPolicy:
    """A policy by name with parameters; strings are parsed (``"1GiB"`` for ``*_bytes``, ``"none"``).

    Raises InputError naming the unknown policy or parameter, or the bad value.
    """
    cls = POLICIES.get(name)
    if cls is None:
        raise InputError(f"unknown budget policy {name!r} (known: {', '.join(sorted(POLICIES))})")
    known = {f.name: f for f in fields(cls)}
    values: dict[str, Any] = {}
    for key, raw in (params or {}).items():
        if key not in known:
            raise InputError(f"policy {name!r} has no parameter {key!r} (parameters: {', '.join(known)})")
        try:
            values[key] = _coerce(key, raw, nullable=known[key].default is None or known[key].default is MISSING)
        except ValueError as exc:
            raise InputError(f"policy parameter {key}: {exc}") from None
    try:
        return cls(**values)
    except ValueError as exc:
        raise InputError(f"policy {name!r}: {exc}") from None


def _coerce(key: str, raw: Any, *, nullable: bool) -> Any:
    if not isinstance(raw, str):
        return raw
    if nullable and raw.strip().lower() in ("none", "null", ""):
        return None
    if key.endswith("_bytes"):
        return parse_bytes(raw)
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"not a number: {raw!r}") from None


@dataclass(frozen=True, kw_only=True)
class BudgetDecision:
    """One update's outcome, with the numbers that explain it."""

    t_s: float  # the controller's clock: the sample's t, never going backwards
    budget_bytes: int
    target_bytes: int  # what the policy wanted (before hysteresis)
    ceiling_bytes: int  # the safety bound min(cap, max(0, A + U - H)) at this sample
    changed: bool
    forced: bool  # a drop the safety bound forced inside a hysteresis hold
    weights: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "t": self.t_s,
            "budget_bytes": self.budget_bytes,
            "target_bytes": self.target_bytes,
            "ceiling_bytes": self.ceiling_bytes,
            "changed": self.changed,
            "forced": self.forced,
            "weights": dict(self.weights),
        }


def _min_change(policy: BudgetPolicy, budget: int) -> float:
    """The smallest move worth a re-plan: ``min_change_fraction`` of the budget, and
    ``min_change_bytes`` — but never more than a fifth of the budget, so that a small budget
    (a 96 MiB session) still follows a 20 % thermal cut."""
    return max(policy.min_change_fraction * budget, min(policy.min_change_bytes, 0.2 * budget))


class BudgetController:
    """Live budget for a session: ``update(sample) -> budget_bytes``; see the module docstring."""

    def __init__(
        self,
        policy: BudgetPolicy | None = None,
        *,
        cap_bytes: int | str | None = None,
        fallback_available_bytes: int | None = None,
    ) -> None:
        self.policy = policy or DefaultPolicy()
        self.cap_bytes = None if cap_bytes is None else parse_bytes(cap_bytes)
        self.fallback_available_bytes = fallback_available_bytes
        self.floor_bytes = 0  # soft signals stop here (a GovernedSession sets its working set)
        self.reset()

    @classmethod
    def from_device_profile(
        cls,
        profile: DeviceProfile | str,
        *,
        policy: BudgetPolicy | None = None,
        cap_bytes: int | str | None = None,
    ) -> BudgetController:
        """A controller for a device: never more than its usable bytes (what the OS leaves a
        model), which also stand in for available memory until telemetry reports it."""
        if isinstance(profile, str):
            from memwarden.models.devices import load_profile

            profile = load_profile(profile)
        usable = profile.usable_bytes
        cap = usable if cap_bytes is None else min(usable, parse_bytes(cap_bytes))
        return cls(policy, cap_bytes=cap, fallback_available_bytes=usable)

    def reset(self) -> None:
        self._t_s: float | None = None
        self._budget: int | None = None
        self._last_change_s = -math.inf
        self._reachable: deque[tuple[float, int]] = deque()
        self._means: dict[str, deque[tuple[float, float]]] = {k: deque() for k in ("temp_c", "power_w", "fps")}
        self._fps_history: deque[tuple[float, float]] = deque()
        self._latest: dict[str, float] = {}
        self._available: int | None = None
        self.last: BudgetDecision | None = None

    @property
    def budget_bytes(self) -> int:
        """The current budget; before the first update, the safety bound of what is known."""
        if self._budget is not None:
            return self._budget
        return self._ceiling(self.fallback_available_bytes, 0)

    def update(self, sample: TelemetrySample, *, in_use_bytes: int = 0) -> int:
        """Feed one sample; ``in_use_bytes``: what the session holds now (counted in its budget,
        absent from available memory). Returns the budget."""
        return self.decide(sample, in_use_bytes=in_use_bytes).budget_bytes

    def decide(self, sample: TelemetrySample, *, in_use_bytes: int = 0) -> BudgetDecision:
        p = self.policy
        t = sample.t_s if self._t_s is None else max(self._t_s, sample.t_s)  # time never runs back
        self._t_s = t
        if sample.mem_available_bytes is not None:
            self._available = sample.mem_available_bytes
        available = self._available if self._available is not None else self.fallback_available_bytes
        in_use = max(0, int(in_use_bytes))
        if available is not None:
            _push(self._reachable, t, available + in_use, p.window_s)
        for key, dq in self._means.items():
            value = getattr(sample, key)
            if value is not None:
                _push(dq, t, value, p.window_s)
        if sample.fps is not None:
            _push(self._fps_history, t, sample.fps, p.reference_window_s)
        for key in ("mem_total_bytes", "power_limit_w"):
            if getattr(sample, key) is not None:
                self._latest[key] = getattr(sample, key)

        signals = self._signals(t)
        ceiling = self._ceiling(available, in_use)
        weights = p.weights(signals)
        if signals.predicted_reachable_bytes is None:
            # No memory signal (a log or a simulation with temperature / power / fps only): the
            # user's cap is all there is to scale, by the same weights the policy would apply.
            memory_bound = ceiling
            target = int(ceiling * max(p.min_weight, min(1.0, math.prod(weights.values()))))
        else:
            memory_bound = min(ceiling, max(0, signals.predicted_reachable_bytes - p.min_headroom_bytes))
            target = min(ceiling, max(0, p.target_bytes(signals)))
        # Heat, power and frame rate are soft: they never take the budget below the floor (what the
        # session needs to serve at all); only memory can, and then the session waits or refuses.
        target = max(target, min(self.floor_bytes, memory_bound))
        target -= target % p.granularity_bytes

        prev = self._budget
        forced = prev is not None and prev > ceiling
        if prev is None or forced:
            new = target
        elif t - self._last_change_s >= p.hysteresis_s and abs(target - prev) >= _min_change(p, prev):
            new = target
        else:
            new = prev
        changed = new != prev
        if changed:
            self._budget, self._last_change_s = new, t
        self.last = BudgetDecision(
            t_s=t,
            budget_bytes=new,
            target_bytes=target,
            ceiling_bytes=ceiling,
            changed=changed,
            forced=forced,
            weights=weights,
        )
        return self.last

    def _ceiling(self, available: int | None, in_use: int) -> int:
        cap = self.cap_bytes
        if available is None:
            return 0 if cap is None else cap  # nothing measured: the user's number is all there is
        bound = max(0, available + in_use - self.policy.min_headroom_bytes)
        return bound if cap is None else min(cap, bound)

    def _signals(self, t: float) -> Signals:
        reachable = predicted = None
        if self._reachable:
            p = self.policy
            reachable = min(v for _, v in self._reachable)
            slope_bps, jitter_bytes = _fit(self._reachable)
            margin_bytes = max(p.noise_margin_bytes, p.noise_margin_sigmas * jitter_bytes)
            predicted = max(0, int(reachable - max(0.0, -slope_bps) * p.hysteresis_s - margin_bytes))
        means = {k: (sum(v for _, v in dq) / len(dq) if dq else None) for k, dq in self._means.items()}
        total = self._latest.get("mem_total_bytes")
        return Signals(
            t_s=t,
            reachable_bytes=reachable,
            predicted_reachable_bytes=predicted,
            mem_total_bytes=None if total is None else int(total),
            temp_c=means["temp_c"],
            power_w=means["power_w"],
            power_limit_w=self._latest.get("power_limit_w"),
            fps=means["fps"],
            fps_best_recent=max((v for _, v in self._fps_history), default=None),
        )


def _push(dq: deque[tuple[float, Any]], t: float, value: Any, window_s: float) -> None:
    """Append and drop what fell out of the window, always keeping the newest value."""
    dq.append((t, value))
    while len(dq) > 1 and dq[0][0] < t - window_s:
        dq.popleft()


def _fit(points: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares line through (t, value): (slope per second, standard deviation of the
    residuals). Slope 0 when time does not vary."""
    pts = list(points)
    n = len(pts)
    if n < 2:
        return 0.0, 0.0
    mean_t = sum(t for t, _ in pts) / n
    mean_v = sum(v for _, v in pts) / n
    var_t = sum((t - mean_t) ** 2 for t, _ in pts)
    slope = 0.0 if var_t <= 0 else sum((t - mean_t) * (v - mean_v) for t, v in pts) / var_t
    residual_var = sum((v - mean_v - slope * (t - mean_t)) ** 2 for t, v in pts) / n
    return slope, math.sqrt(residual_var)


def replay(samples: Iterable[TelemetrySample], controller: BudgetController | None = None) -> list[BudgetDecision]:
    """Every sample of a recorded log through one controller (a fresh default one if none)."""
    controller = controller or BudgetController()
    return [controller.decide(s) for s in samples]
