"""A session budget that follows a replayed device-state log and steps down before the OS kills.

The log is what ``device_state.read_state`` reads (tegrastats, ``/proc/meminfo``, ``free``, PSI,
``onTrimMemory``, jetsam reports, ``os_proc_available_memory``, ...), one sample per *tick*. At each
tick the **kill limit** is what one more allocation of the session's kind can get in that state
(:func:`~memwarden.govern.device_state.obtainable`: MemAvailable on a Jetson, capped by the jetsam
limit on an iPhone), times ``scale`` (a log from an 8 GB board driving a model of megabytes): a
process whose footprint passes it has its allocation refused or is killed (lmkd, jetsam, the OOM
killer). The log was recorded without the session, so the whole limit is the session's to lose.

The budget, a pure function of the ticks so far (:class:`StepDownPolicy` holds every number)::

    target = (limit - fall) * (1 - headroom_fraction) * min(pressure weights)

- ``fall``: the limit's drop since the previous tick. A budget held until the next tick must still
  be under the limit there if the fall goes on at the same pace; this is what makes the session step
  down *before* the limit reaches it, not at it.
- pressure weights: PSI ``some avg10`` above ``psi_knee`` percent (Linux, Android: time stalled on
  memory, which lmkd's PSI mode kills on) and the latest ``onTrimMemory`` level for
  ``trim_hold_ticks`` ticks (Android's warning before lmkd acts). Both are signals that the limit is
  about to fall further; each lowers the budget by its own factor (the smallest applies).
- hysteresis: a lower target applies at once (safety); a higher one only after ``rise_after_ticks``
  ticks in a row above the budget by ``min_rise_fraction``, and then to the least of them.

Invariant after every tick: ``0 <= budget_bytes < limit_bytes`` whenever the limit is positive
(``headroom_fraction > 0``), and ``budget_bytes <= cap_bytes``.

Ticks are explicit (:meth:`StateBudget.advance`, :meth:`StateBudget.advance_to`): a replay never
reads a clock, so it gives the same budgets every time. Torch-free: it is a
:class:`~memwarden.govern.budget_value.BudgetSource` a ``GovernedSession`` reads before each request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memwarden.govern.device_state import KINDS, DeviceState, obtainable, read_state

__all__ = ["StateBudget", "StepDecision", "StepDownPolicy"]

# onTrimMemory levels (android.content.ComponentCallbacks2) -> budget factor. The RUNNING_* levels
# come while the app is in the foreground and the system is low (MODERATE, LOW, CRITICAL: lmkd is
# killing background processes, then will kill ours); the background levels say where the app sits
# on lmkd's list. UI_HIDDEN (20) is about the UI, not memory: no factor. The factors are this
# policy's choice, not platform figures.
_TRIM_WEIGHTS: Mapping[int, float] = {5: 0.9, 10: 0.8, 15: 0.6, 40: 0.8, 60: 0.7, 80: 0.5}


@dataclass(frozen=True, kw_only=True)
class StepDownPolicy:
    """Every number the step-down uses; see the module docstring."""

    kind: str = "host"  # the allocation the session makes: cuda (unified on Jetson), host, mmap
    headroom_fraction: float = 0.08  # of the limit never handed out: allocator slack, the next tick's jitter
    psi_knee: float = 10.0  # PSI some avg10 (%) where the budget starts to fall
    psi_full: float = 40.0  # ... and where it reaches psi_floor
    psi_floor: float = 0.7
    trim_weights: Mapping[int, float] = field(default_factory=lambda: dict(_TRIM_WEIGHTS))
    trim_hold_ticks: int = 3  # a trim callback is an event: it weighs on this many ticks
    rise_after_ticks: int = 2  # ticks in a row with a higher target before the budget rises
    min_rise_fraction: float = 0.02  # a rise smaller than this fraction of the budget is not worth a re-plan

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.kind == "contiguous":
            raise ValueError(f"kind {self.kind!r}: a session allocates cuda, host or mmap memory")
        if not 0 < self.headroom_fraction < 1:
            raise ValueError("headroom_fraction must be in (0, 1)")
        if not 0 <= self.psi_knee < self.psi_full or not 0 < self.psi_floor <= 1:
            raise ValueError("need 0 <= psi_knee < psi_full and psi_floor in (0, 1]")
        if any(not 0 < w <= 1 for w in self.trim_weights.values()):
            raise ValueError("trim weights must be in (0, 1]")
        if self.trim_hold_ticks < 1 or self.rise_after_ticks < 1 or self.min_rise_fraction < 0:
            raise ValueError("trim_hold_ticks and rise_after_ticks must be at least 1, min_rise_fraction >= 0")

    def psi_weight(self, avg10: float) -> float:
        if avg10 <= self.psi_knee:
            return 1.0
        over = min(1.0, (avg10 - self.psi_knee) / (self.psi_full - self.psi_knee))
        return 1.0 - over * (1.0 - self.psi_floor)


@dataclass(frozen=True, kw_only=True)
class StepDecision:
    """One tick: the kill limit, what the policy wanted, the budget in force after it, and why."""

    tick: int
    limit_bytes: int | None  # the kill limit at this tick (scaled); None: the log has shown no memory figure yet
    target_bytes: int
    budget_bytes: int
    weights: Mapping[str, float]
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "tick": self.tick,
            "limit_bytes": self.limit_bytes,
            "target_bytes": self.target_bytes,
            "budget_bytes": self.budget_bytes,
            "weights": dict(self.weights),
            "reason": self.reason,
        }


class StateBudget:
    """A budget source over a device-state replay; ``advance()`` moves it one tick (one sample).

    Before the first tick the budget is ``cap_bytes`` (or 0 without one): a session built on it
    should be built after ``advance()``. ``scale`` multiplies every byte figure the log gives."""

    def __init__(
        self,
        samples: Sequence[DeviceState],
        *,
        policy: StepDownPolicy | None = None,
        scale: float = 1.0,
        cap_bytes: int | None = None,
    ) -> None:
        if not samples:
            raise ValueError("a device-state replay needs at least one sample")
        if not scale > 0:
            raise ValueError("scale must be positive")
        self.samples = list(samples)
        self.policy = policy or StepDownPolicy()
        self.scale = scale
        self.cap_bytes = cap_bytes
        self.decisions: list[StepDecision] = []
        self._budget = 0 if cap_bytes is None else int(cap_bytes)
        self._limit: int | None = None
        self._trim: tuple[int, int] | None = None  # (level, tick it was logged)
        self._higher: list[int] = []  # targets of the ticks in a row above the budget

    @classmethod
    def from_lines(
        cls,
        lines: Iterable[str],
        *,
        policy: StepDownPolicy | None = None,
        start_limit_bytes: int | None = None,
        cap_bytes: int | None = None,
    ) -> StateBudget:
        """A replay of pasted lines; ``start_limit_bytes`` scales the log so that its first kill
        limit is that many bytes (a device's log against a smaller model)."""
        samples = read_state(lines).samples
        policy = policy or StepDownPolicy()
        scale = 1.0
        if start_limit_bytes is not None:
            first = next((b for s in samples if (b := obtainable(s, policy.kind).bytes)), None)
            if first is None:
                raise ValueError("the log has no memory figure to scale")
            scale = start_limit_bytes / first
        return cls(samples, policy=policy, scale=scale, cap_bytes=cap_bytes)

    # -- the BudgetSource the session reads ----------------------------------------------------

    @property
    def budget_bytes(self) -> int:
        return self._budget

    @property
    def limit_bytes(self) -> int | None:
        """The kill limit at the current tick (scaled): the footprint the OS acts at."""
        return self._limit

    @property
    def tick(self) -> int:
        """The index of the sample in force; -1 before the first ``advance()``."""
        return len(self.decisions) - 1

    @property
    def done(self) -> bool:
        return len(self.decisions) >= len(self.samples)

    # -- ticks -----------------------------------------------------------------------------------

    def advance(self) -> StepDecision:
        """Read the next sample; the last one stays in force once the log ends."""
        i = min(len(self.decisions), len(self.samples) - 1)
        state = self.samples[i]
        p = self.policy
        got = obtainable(state, p.kind).bytes
        previous = self._limit
        if got is not None:
            self._limit = int(got * self.scale)
        limit = self._limit
        weights: dict[str, float] = {}
        psi = state.value("psi_some_avg10")
        if isinstance(psi, (int, float)) and (w := p.psi_weight(float(psi))) < 1.0:
            weights["psi"] = w
        trim = state.value("trim_level")
        if isinstance(trim, int):
            self._trim = (trim, i)
        if self._trim is not None and i - self._trim[1] < p.trim_hold_ticks:
            if (w := p.trim_weights.get(self._trim[0], 1.0)) < 1.0:
                weights["trim"] = w
        if limit is None:
            target = self._budget
            reason = "no memory figure yet"
        else:
            fall = max(0, previous - limit) if previous is not None else 0
            target = int(max(0, limit - fall) * (1 - p.headroom_fraction) * min(weights.values(), default=1.0))
            if self.cap_bytes is not None:
                target = min(target, int(self.cap_bytes))
            reason = f"limit {limit} bytes" + (f", falling {fall} a tick" if fall else "")
        self._budget, why = self._hold(target, first=not self.decisions)
        decision = StepDecision(
            tick=len(self.decisions),
            limit_bytes=limit,
            target_bytes=target,
            budget_bytes=self._budget,
            weights=weights,
            reason=f"{reason}{', ' if weights else ''}{', '.join(f'{k} x{v:.2f}' for k, v in weights.items())}; {why}",
        )
        self.decisions.append(decision)
        return decision

    def advance_to(self, tick: int) -> StepDecision:
        """Advance until the sample of index ``tick`` is in force (never backwards)."""
        if tick < 0:
            raise ValueError("ticks start at 0")
        if not self.decisions:
            self.advance()
        while self.tick < tick:
            self.advance()
        return self.decisions[-1]

    def _hold(self, target: int, *, first: bool) -> tuple[int, str]:
        budget = self._budget
        if first or target < budget:
            self._higher = []
            return target, "set" if first else "stepped down at once"
        if target <= budget * (1 + self.policy.min_rise_fraction):
            self._higher = []
            return budget, "held"
        self._higher.append(target)
        if len(self._higher) < self.policy.rise_after_ticks:
            return budget, f"higher target {len(self._higher)}/{self.policy.rise_after_ticks} ticks: held"
        rise = min(self._higher)
        self._higher = []
        return rise, "rose after the pressure passed"
