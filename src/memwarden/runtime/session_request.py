"""One request inside a GovernedSession: what it asked for, and the plan it is served with.

A request's state is its own object, passed to the admission step and the generate call, never
fields of the session: ``predict()`` may run beside a request being served, and two requests
never share a half-written plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from memwarden.runtime.admission import Decision


@dataclass
class RequestRecord:
    """One served sequence: what was reused, what admission decided, how long it took."""

    prompt_tokens: int
    reused_tokens: int
    new_tokens: int
    media_items: int
    media_reencoded: bool
    decision: Decision
    prefill_s: float = 0.0  # time to first token
    total_s: float = 0.0
    rung: int = 0  # degradation rung the request was served at (0: none)
    encoder_s: float = 0.0  # time in media encoders
    overhead_s: float = 0.0  # the session's own time: admission, hashing, bookkeeping (serving less generate())
    # the same in CPU time of the serving thread: what the session costs, not what a loaded machine makes it wait
    overhead_cpu_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "new_tokens": self.new_tokens,
            "media_items": self.media_items,
            "media_reencoded": self.media_reencoded,
            "decision": self.decision.to_json(),
            "ttft_s": round(self.prefill_s, 6),
            "rung": self.rung,
            "encoder_s": round(self.encoder_s, 6),
            "total_s": round(self.total_s, 6),
            "overhead_s": round(self.overhead_s, 6),
            "overhead_cpu_s": round(self.overhead_cpu_s, 6),
        }


class FirstTokenStreamer:
    """A generate() streamer that only notes when the first new token arrives."""

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner
        self.calls = 0
        self.first_token_at: float | None = None

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2 and self.first_token_at is None:  # call 1 is the prompt
            self.first_token_at = time.perf_counter()
        if self.inner is not None:
            self.inner.put(value)

    def end(self) -> None:
        if self.inner is not None:
            self.inner.end()

    def restartable(self) -> bool:
        """Whether the request can start over without the caller seeing anything twice."""
        return self.inner is None or self.calls == 0

    def restart(self) -> None:
        self.calls, self.first_token_at = 0, None


@dataclass(frozen=True, kw_only=True)
class RequestPlan:
    """How a request would be served at one rung: its (maybe pruned) inputs and the prefix it reuses."""

    input_ids: torch.Tensor  # (1, T) after the rung: a pruned request has fewer image tokens
    inputs: dict[str, Any]  # the rest of the request's inputs after the rung
    items: list[Any]  # media items (media.MediaItem), fingerprints tagged with the rung
    reuse_tokens: int  # prefix tokens found in the KV pool
    media_in: dict[str, Any]  # media tensors the model must still see (those after the reused prefix)
    pruned: Any = None  # the pruner's request to install around generate(), or None
    unpruned: tuple[torch.Tensor, int] | None = None  # (original ids, tokens pruned) of a pruned request

    @property
    def ids(self) -> list[int]:
        return self.input_ids[0].tolist()

    @property
    def new_ids(self) -> torch.Tensor:  # (1, T - reuse): what prefill computes
        return self.input_ids[:, self.reuse_tokens :]

    @property
    def tensor_bytes(self) -> int:
        """The request's own tensors (ids, pixels, audio features): alive throughout, so counted."""
        tensors = [self.input_ids] + [v for v in self.inputs.values() if isinstance(v, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class Request:
    """One sequence being admitted and served: owned by the serving call that made it."""

    input_ids: torch.Tensor  # (1, T) as the caller sent it
    inputs: dict[str, Any]  # media and generate() keywords as the caller sent them
    max_new_tokens: int
    rung: int = 0  # quality rung (0: none); starts at the latency level, which persists across requests
    changes: list[str] = field(default_factory=list)  # what admission changed for it, in order
    streaming_failed: bool = False  # the last change tried to stream more weights and freed nothing
    plan: RequestPlan | None = None  # the plan it was admitted with
    decision: Decision | None = None
    start_s: float = field(default_factory=time.perf_counter)  # perf_counter() when admission began

    @property
    def rungs_taken(self) -> int:
        """Quality rungs admission stepped down for this request (beyond the latency level)."""
        return sum(1 for c in self.changes if c.split(" ")[0] in ("prune", "resolution"))

    @property
    def encoder_drops(self) -> int:
        """Times admission dropped the cached encoder outputs for this request."""
        return self.changes.count("dropped cached encoder outputs")

    @property
    def restreams(self) -> int:
        return sum(c.startswith("streamed weights") for c in self.changes)


__all__ = ["FirstTokenStreamer", "Request", "RequestPlan", "RequestRecord"]
