"""The session's budget as one value, parsed once where it comes in.

A budget reaches a ``GovernedSession`` as bytes (``6GiB``, an int), as a source that moves (a
telemetry :class:`~memwarden.govern.budget.BudgetController`, anything with ``budget_bytes``), or as
both (a source capped by a fixed figure). :meth:`Budget.parse` turns what the user gave into a
:class:`Budget` at the door; from there on the session asks it for :meth:`Budget.bytes_now` with the
process's real limit as a cap, and changes it with :meth:`Budget.with_fixed` / :meth:`Budget.with_source`.
A Budget always has a fixed figure or a source, so the bytes in force are always a number: there is
no sentinel for "no limit" (``budget=None`` is refused at the door, naming the alternatives).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

from memwarden.units import parse_bytes

__all__ = ["Budget", "BudgetSource"]


class BudgetSource(Protocol):
    """A budget that moves (``govern.budget.BudgetController`` following telemetry): the session reads
    ``budget_bytes`` before every request and resizes its pool to it."""

    @property
    def budget_bytes(self) -> int: ...


@dataclass(frozen=True)
class Budget:
    """A fixed budget in bytes, a :class:`BudgetSource` read each time, or both (the fixed figure caps
    the source). Frozen: a change is a new value."""

    fixed_bytes: int | None = None
    source: BudgetSource | None = None

    def __post_init__(self) -> None:
        if self.fixed_bytes is None and self.source is None:
            raise TypeError("a Budget needs a number of bytes or a budget source")
        if self.fixed_bytes is not None and (isinstance(self.fixed_bytes, bool) or self.fixed_bytes < 0):
            raise ValueError(f"a budget must be a non-negative number of bytes, not {self.fixed_bytes!r}")

    @classmethod
    def parse(cls, budget: int | str | BudgetSource | Budget, cap: int | str | None = None) -> Budget:
        """What the user gave, as a Budget: bytes (an int or a size string such as ``6GiB``) or a
        budget source (an object with ``budget_bytes``), with ``cap`` (a fixed figure given elsewhere,
        ``SessionConfig.budget``) capping a source. TypeError, naming what was given, for anything
        else: ``None`` or a list is never taken for a source; a cap that contradicts fixed bytes is
        refused rather than one of two answers silently winning."""
        if isinstance(budget, Budget):
            return budget
        if budget is None:
            raise TypeError(
                "budget=None sets no limit: give a number of bytes, a string such as 6GiB, "
                "or a budget controller (an object with budget_bytes)"
            )
        capped = None if cap is None else parse_bytes(cap)
        if not isinstance(budget, str) and hasattr(budget, "budget_bytes") and not isinstance(budget, type):
            return cls(fixed_bytes=capped, source=budget)
        fixed = parse_bytes(budget)  # TypeError / ValueError for what is not a quantity of bytes
        if capped is not None and capped != fixed:
            raise TypeError(
                f"GovernedSession got budget={budget!r} and config.budget={cap!r}: give the budget once, as the "
                "budget argument"
            )
        return cls(fixed_bytes=fixed)

    def bytes_now(self, limit_bytes: int | None = None) -> int:
        """The bytes in force: the smallest of the fixed figure, the source's current reading and
        ``limit_bytes`` (what the process may really allocate), those given."""
        figures = [b for b in (self.fixed_bytes, self.limit_of_source(), limit_bytes) if b is not None]
        return int(min(figures))

    def limit_of_source(self) -> int | None:
        return None if self.source is None else int(self.source.budget_bytes)

    def with_fixed(self, budget: int | str) -> Budget:
        """This budget with a new fixed figure (``set_budget``)."""
        return dataclasses.replace(self, fixed_bytes=parse_bytes(budget))

    def with_source(self, source: BudgetSource) -> Budget:
        """This budget following ``source`` (a telemetry controller created on first use), the fixed
        figure still capping it."""
        return dataclasses.replace(self, source=source)
