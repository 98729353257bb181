"""SessionHooks: the caller's code a GovernedSession calls into, as one frozen value.

A session is built from a model, a budget, knobs (:class:`SessionConfig`: numbers and switches
that compare and log as values) and the caller's own code — a callback told each admission
decision, a function that lowers a request's resolution, a store for encoder outputs. Those are
objects, not knobs: they do not compare as values and a deployment does not log them, so they
travel together here rather than as one keyword each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from memwarden.runtime.admission import Decision


class EncoderStore(Protocol):
    """Where encoder outputs are cached (``runtime/featcache_contract.TieredEncoderStore``, an LRU)."""

    def get(self, key: str) -> Any | None: ...

    def put(self, key: str, value: Any) -> None: ...

    def clear(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class SessionHooks:
    """What the session calls; ``None`` everywhere is the session's historical behaviour."""

    on_decision: Callable[[Decision], None] | None = None  # told every admitted request's decision
    # rung 2 of the ladder (runtime/degrade.py): (inputs, scale) -> the inputs at that resolution
    lower_resolution: Callable[[dict[str, Any], float], dict[str, Any]] | None = None
    encoder_store: EncoderStore | None = None  # None: the tiered store sized by config.encoder_cache_bytes


__all__ = ["EncoderStore", "SessionHooks"]
