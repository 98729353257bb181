"""One ``Analysis`` per trace: what several analyses derive from it, each computed once.

A ``memwarden report`` asks for the summary, the free index, the device and an allocator replay
from the pattern detectors, the HTML page and the heatmap. Each is a cached property (or, for the
replay, memoised per its arguments) of the one ``Analysis`` they share, so a run computes each
once. The trace is treated as frozen: an ``Analysis`` never notices a trace that changes under it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from memwarden.analyze.lines import LineBytes, lines_of_rows
from memwarden.analyze.timeline import (
    Summary,
    Timeline,
    free_index,
    live_blocks_at,
    primary_device,
    summary,
    timeline,
)
from memwarden.plan.allocator.config import AllocatorConfig
from memwarden.plan.records import ReplayResult
from memwarden.plan.replay import replay
from memwarden.trace.model import Trace
from memwarden.trace.steps import Step, steps_of

__all__ = ["Analysis"]


@dataclass(frozen=True)
class _ReplayKey:
    allocator: str
    config: AllocatorConfig
    arena_strategy: str


class Analysis:
    """The shared, lazily computed views of one Trace, all on one device (``device``)."""

    def __init__(self, trace: Trace, *, replay_history_columns: int = 0) -> None:
        """``replay_history_columns``: layout columns every replay records unless asked otherwise
        (a report that draws a heatmap sets it, so the detectors' replay is also the picture's)."""
        self.trace = trace
        self.replay_history_columns = replay_history_columns
        self._replays: dict[_ReplayKey, tuple[int, ReplayResult]] = {}  # key -> (history_columns, result)
        self._timelines: dict[tuple[str, int], Timeline] = {}

    @cached_property
    def device(self) -> int:
        """The device every view talks about: the one the metadata names, else the busiest.

        The one rule for summary, diagnose, replay, report and heatmap (``primary_device``)."""
        return primary_device(self.trace)

    @cached_property
    def device_name(self) -> str:
        return self.trace.devices[self.device] if self.trace.devices else "cpu"

    @cached_property
    def signed_bytes(self) -> np.ndarray:
        """Per event on ``device``: +bytes when a block appears, -bytes when it goes, else 0."""
        return _frozen(self.trace.signed_bytes(self.device))

    @cached_property
    def live_bytes(self) -> np.ndarray:
        """Live bytes on ``device`` after each event."""
        return _frozen(np.cumsum(self.signed_bytes))

    @cached_property
    def free_index(self) -> np.ndarray:
        """For each event row, the row that frees its block (``num_events`` if never)."""
        return _frozen(free_index(self.trace))

    @cached_property
    def summary(self) -> Summary:
        return summary(self.trace, self.device, free_rows=self.free_index)

    @cached_property
    def steps(self) -> tuple[Step, ...]:
        """The root calls (prefill, decode, training steps) in start order, validated once."""
        return tuple(steps_of(self.trace))

    @cached_property
    def step_grad(self) -> tuple[bool | None, ...]:
        """Per step of ``steps`` (start order): whether autograd was recording when the call began,
        None where the trace does not say (traces from before it was recorded, snapshots)."""
        return tuple(step.grad for step in self.steps)

    def lines_at(self, index: int, limit: int = 15) -> list[LineBytes]:
        """The lines of the user's code holding the most bytes on ``device`` just after event ``index``."""
        if index < 0 or not self.trace.num_events:
            return []
        return lines_of_rows(self.trace, live_blocks_at(self.trace, index, self.device, self.free_index), limit)

    def timeline(self, by: str = "category", max_points: int = 2000) -> Timeline:
        key = (by, max_points)
        if key not in self._timelines:
            self._timelines[key] = timeline(self.trace, by=by, max_points=max_points, device=self.device)
        return self._timelines[key]

    def replay(
        self,
        *,
        allocator: str = "pytorch",
        config: AllocatorConfig | None = None,
        history_columns: int = 0,
        arena_strategy: str = "best",
    ) -> ReplayResult:
        """``memwarden.plan.replay.replay`` of ``device``, memoised per its arguments.

        A replay that recorded layout history answers a request without history too: the history
        only adds columns for a heatmap, every number is the same. So a report that draws its
        heatmap first replays once for both the picture and the ``fragmentation`` detector.
        """
        key = _ReplayKey(allocator, config or AllocatorConfig(), arena_strategy)
        history_columns = history_columns or self.replay_history_columns
        cached = self._replays.get(key)
        if cached is not None and (history_columns == 0 or cached[0] == history_columns):
            return cached[1]
        result = replay(
            self.trace,
            key.config,
            self.device,
            allocator=allocator,
            history_columns=history_columns,
            arena_strategy=arena_strategy,
        )
        if cached is None or history_columns:
            self._replays[key] = (history_columns, result)
        return result


def _frozen(values: np.ndarray) -> np.ndarray:
    """Read-only: every reader shares the one array, so none may write into it."""
    values.setflags(write=False)
    return values
