"""Running counts over a GovernedSession's request records and decision log.

``stats()`` reports how many requests were served, admission's decisions and refusals by reason,
the log's entries by kind, the latest request's rung, prefix reuse and media encoding, and the
latest telemetry reading the budget followed. Counting them from the lists at every call costs one pass over everything the session
ever did, and a metrics scrape asks for them every few seconds of a service that runs for days.
The records and the log only grow (both are append-only lists), so a :class:`SessionTally` keeps
the counts and, at each look, advances them over what was appended since the last one: a look
costs the new entries, never the whole history. The counts equal a count over the lists up to
the same entries (tested), so ``stats()`` says the same with or without the lists.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from memwarden.runtime.session_request import RequestRecord

__all__ = ["TELEMETRY_FIELDS", "SessionTally"]

# The readings a budget note carries when the budget followed telemetry (``SessionMemory.apply_telemetry``).
TELEMETRY_FIELDS = ("temp_c", "power_w", "fps")


class SessionTally:
    """The counts of one session's records and events, advanced incrementally (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # two scrapes at once must not count the same entries twice
        self._records_seen = 0
        self._events_seen = 0
        self._decisions: Counter[str] = Counter()  # admitted requests by admission's action
        self._refusals: Counter[str] = Counter()  # refused requests by reason code
        self._event_counts: Counter[str] = Counter()  # log entries by kind
        self._rung = 0  # the latest request's degradation rung
        # the latest request's prompt tokens served from cached KV blocks, and whether its media went
        # through the encoder (None: no request yet): a chat's turn 2 reads them from stats() itself
        self._reused_tokens = 0
        self._media_reencoded: bool | None = None
        self._reused_tokens_total = 0  # prompt tokens served from cached KV blocks, every request
        self._telemetry: dict[str, float] = {}  # the latest reading the budget followed

    def look(
        self, records: Sequence[RequestRecord], events: Sequence[dict[str, Any]]
    ) -> tuple[dict[str, Any], int, int]:
        """The counts over the lists as they are now, and how many records and events they cover (a
        caller listing them too stops there, so that its lists and its counts say the same)."""
        with self._lock:
            num_records, num_events = len(records), len(events)
            for record in records[self._records_seen : num_records]:
                self._decisions[record.decision.action] += 1
                self._rung = record.rung
                self._reused_tokens, self._media_reencoded = record.reused_tokens, record.media_reencoded
                self._reused_tokens_total += record.reused_tokens
            for event in events[self._events_seen : num_events]:
                kind = str(event.get("kind"))
                self._event_counts[kind] += 1
                if kind == "refuse":
                    self._refusals[str(event.get("reason") or event.get("label", ""))] += 1
                elif kind == "budget" and "temp_c" in event:
                    self._telemetry = {k: float(event[k]) for k in TELEMETRY_FIELDS if event.get(k) is not None}
            self._records_seen, self._events_seen = num_records, num_events
            counts = {
                "requests_served": num_records,
                "decisions": dict(self._decisions),
                "refusals": dict(self._refusals),
                "event_counts": dict(self._event_counts),
                "degradation_rung": self._rung,
                "reused_tokens": self._reused_tokens,
                "media_reencoded": self._media_reencoded,
                "reused_tokens_total": self._reused_tokens_total,
                "telemetry": dict(self._telemetry),
            }
            return counts, num_records, num_events
