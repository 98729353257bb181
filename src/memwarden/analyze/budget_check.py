"""Did a governed run stay under its moving budget? A pure check over a Trace.

A GovernedSession notes its decisions on the capture's timeline (``trace.metadata
["annotations"]``): ``admit`` when it starts a request and ``kv-pool`` when it resizes its pool,
each with the ``budget_bytes`` it conformed to. A budget *drop* takes effect at the resize that
follows it, so the budget in force at a time is the one of the latest ``admit`` or ``kv-pool``
note. Live bytes count the model's weights (alive before the capture) and everything allocated
during it; other tensors that predate the capture belong to the caller, not the session.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memwarden.trace.model import Action, Category, Trace

_CONFORMED = ("admit", "kv-pool")


@dataclass(frozen=True, kw_only=True)
class BudgetCheck:
    checked_events: int
    violations: int
    worst_over_bytes: int  # most bytes above the budget in force (<= 0: never over)
    worst_time_us: int
    peak_bytes: int
    min_budget_bytes: int
    max_budget_bytes: int

    @property
    def ok(self) -> bool:
        return self.violations == 0


def session_live_bytes(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(time_us, live bytes) after every event: weights and what was allocated during the capture."""
    ev = trace.events
    act = ev["action"]
    model_state = np.isin(ev["category"], [int(Category.WEIGHT), int(Category.BUFFER)])
    born = (act == int(Action.ALLOC)) | ((act == int(Action.PREEXISTING)) & model_state)
    theirs = ev["tensor"][(act == int(Action.PREEXISTING)) & ~model_state]
    died = (act == int(Action.FREE)) & ~np.isin(ev["tensor"], theirs)
    sign = np.where(born, 1, np.where(died, -1, 0))
    return ev["time_us"].astype(np.int64), np.cumsum(sign * ev["nbytes"].astype(np.int64))


def budget_in_force(annotations: list[dict], times_us: np.ndarray) -> np.ndarray:
    points = sorted(
        (int(a["time_us"]), int(a["budget_bytes"]))
        for a in annotations
        if isinstance(a, dict) and a.get("kind") in _CONFORMED and "budget_bytes" in a
    )
    if not points:
        return np.full(len(times_us), np.iinfo(np.int64).max)
    t = np.array([p[0] for p in points], dtype=np.int64)
    b = np.array([p[1] for p in points], dtype=np.int64)
    idx = np.searchsorted(t, times_us, side="right") - 1
    return np.where(idx >= 0, b[np.clip(idx, 0, None)], np.iinfo(np.int64).max)


def check_budget(trace: Trace, model_state_bytes: int | None = None) -> BudgetCheck:
    """Live bytes vs the budget in force, from the session's first admission on.

    ``model_state_bytes``: the served model's weights and buffers. Weights of other models alive
    in the process when the capture started (a test suite's fixtures, a second app model) are
    not the session's: with it, only that many bytes of the preexisting weights are counted."""
    annotations = [a for a in trace.metadata.get("annotations", []) if isinstance(a, dict)]
    times, live = session_live_bytes(trace)
    if model_state_bytes is not None:
        ev = trace.events
        state = np.isin(ev["category"], [int(Category.WEIGHT), int(Category.BUFFER)])
        preexisting = int(ev["nbytes"][(ev["action"] == int(Action.PREEXISTING)) & state].sum())
        live = live - max(0, preexisting - int(model_state_bytes))
    limit = budget_in_force(annotations, times)
    admits = [int(a["time_us"]) for a in annotations if a.get("kind") == "admit"]
    after = times >= (min(admits) if admits else np.iinfo(np.int64).max)
    over = (live - limit)[after]
    budgets = [int(a["budget_bytes"]) for a in annotations if a.get("kind") in _CONFORMED and "budget_bytes" in a]
    worst = int(over.max()) if over.size else 0
    return BudgetCheck(
        checked_events=int(after.sum()),
        violations=int((over > 0).sum()),
        worst_over_bytes=worst,
        worst_time_us=int(times[after][int(over.argmax())]) if over.size else 0,
        peak_bytes=int(live[after].max()) if over.size else 0,
        min_budget_bytes=min(budgets, default=0),
        max_budget_bytes=max(budgets, default=0),
    )
