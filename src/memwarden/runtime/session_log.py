"""The decision log of a GovernedSession: every budget change, pool resize, stream and degradation.

One log is shared by the session and the objects it holds (its memory, its admission loop), so the
order of ``session.events`` is the order things happened. Each note also lands on the timeline of a
running capture, where a report shows it beside the bytes it explains.
"""

from __future__ import annotations

import time
from typing import Any


class EventLog:
    """Append-only list of ``{"t_s", "kind", "label", **details}`` dicts."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def note(self, kind: str, label: str, **details: Any) -> None:
        """Record a decision here and on the timeline of a running capture."""
        from memwarden.record.live.capture import annotate

        self.events.append({"t_s": time.monotonic(), "kind": kind, "label": label, **details})
        annotate(kind, label, **details)


__all__ = ["EventLog"]
