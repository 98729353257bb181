"""The degradation ladder: what a GovernedSession gives up, in order, when memory or time runs short.

Rungs, cheapest in quality first:

1. prune visual tokens by importance (``runtime/prune.py``: similarity to the image's summary
   by default, FastV attention optionally) — keep 50%, then 25%;
2. lower the image resolution / sample fewer frames — through a ``lower_resolution(inputs,
   scale) -> inputs`` callable the application gives (it owns the processor and the raw media);
3. move KV blocks to a lower tier (the session's admission shrinks its pool through the swap
   file; see ``session.py``);
4. fall back to a smaller language model the application registered.

Memory pressure is handled per request by admission control (a rung is applied only to the
request that needs it, so it is undone as soon as the budget allows). Latency pressure is a
level that persists: :class:`LatencyController` weighs the encoder's and the decoder's time
(``0.6·encoder + 0.4·decoder`` by default) against a target, steps the level up when a request
is over it, and back down after ``recover_after`` requests under ``calm_fraction`` of it
(hysteresis, so the level does not flap). Every step is recorded with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class LadderConfig:
    """What the ladder may do. ``latency_target_s=None``: memory pressure only."""

    latency_target_s: float | None = None
    encoder_weight: float = 0.6
    decoder_weight: float = 0.4
    prune_keep_ratios: tuple[float, ...] = (0.5, 0.25)
    prune_method: str = "summary"
    resolution_scales: tuple[float, ...] = (0.5,)
    recover_after: int = 2  # calm requests before stepping a latency level back down
    calm_fraction: float = 0.8  # "calm": weighted latency under this fraction of the target

    def __post_init__(self) -> None:
        if self.latency_target_s is not None and not self.latency_target_s > 0:
            raise ValueError("latency_target_s must be positive")
        if self.encoder_weight < 0 or self.decoder_weight < 0 or self.encoder_weight + self.decoder_weight <= 0:
            raise ValueError("encoder_weight and decoder_weight must be non-negative, not both zero")
        if any(not 0 < r < 1 for r in self.prune_keep_ratios) or list(self.prune_keep_ratios) != sorted(
            self.prune_keep_ratios, reverse=True
        ):
            raise ValueError("prune_keep_ratios must be in (0, 1), largest first")
        if any(not 0 < s < 1 for s in self.resolution_scales):
            raise ValueError("resolution_scales must be in (0, 1)")


@dataclass(frozen=True, kw_only=True)
class Step:
    """One rung applied to one request (or a latency level change)."""

    rung: str  # "prune" | "resolution" | "kv-tier" | "fallback" | "level"
    setting: Any
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"rung": self.rung, "setting": self.setting, "reason": self.reason}


@dataclass
class LatencyController:
    """A persistent degradation level driven by weighted latency, with hysteresis."""

    config: LadderConfig
    max_level: int
    level: int = 0
    calm: int = 0
    history: list[dict[str, float]] = field(default_factory=list)

    def weighted_s(self, encoder_s: float, decoder_s: float) -> float:
        c = self.config
        return (c.encoder_weight * encoder_s + c.decoder_weight * decoder_s) / (c.encoder_weight + c.decoder_weight)

    def observe(self, encoder_s: float, decoder_s: float) -> Step | None:
        """Feed one request's times; returns the level change it caused, if any."""
        target = self.config.latency_target_s
        weighted = self.weighted_s(encoder_s, decoder_s)
        self.history.append({"encoder_s": encoder_s, "decoder_s": decoder_s, "weighted_s": weighted})
        if target is None:
            return None
        if weighted > target and self.level < self.max_level:
            self.level += 1
            self.calm = 0
            return Step(
                rung="level",
                setting=self.level,
                reason=f"weighted latency {weighted:.3f} s over the {target:.3f} s target",
            )
        if weighted < self.config.calm_fraction * target:
            self.calm += 1
            if self.calm >= self.config.recover_after and self.level > 0:
                self.level -= 1
                self.calm = 0
                return Step(
                    rung="level",
                    setting=self.level,
                    reason=f"{self.config.recover_after} requests under {self.config.calm_fraction:.0%} "
                    "of the latency target: pressure passed",
                )
        else:
            self.calm = 0
        return None


class Ladder:
    """The rungs a session can apply to one request, from the cheapest; see the module docstring."""

    def __init__(
        self,
        model: Any,
        config: LadderConfig | None = None,
        lower_resolution: Callable[[dict[str, Any], float], dict[str, Any]] | None = None,
    ) -> None:
        self.model = model
        self.config = config or LadderConfig()
        self.lower_resolution = lower_resolution
        self._pruner: Any = None
        self._prune_unsupported: str | None = None
        try:
            from memwarden.runtime.prune import unsupported_reason

            self._prune_unsupported = unsupported_reason(model)
        except Exception as exc:  # noqa: BLE001 (a model the pruner cannot even inspect)
            self._prune_unsupported = str(exc)
        self.rungs = self._rungs()
        self.latency = LatencyController(self.config, max_level=len(self.rungs))

    def _rungs(self) -> list[tuple[str, Any]]:
        rungs: list[tuple[str, Any]] = []
        if self._prune_unsupported is None:
            rungs += [("prune", r) for r in self.config.prune_keep_ratios]
        if self.lower_resolution is not None:
            rungs += [("resolution", s) for s in self.config.resolution_scales]
        return rungs

    @property
    def pruning_supported(self) -> bool:
        return self._prune_unsupported is None

    def apply(self, rung: tuple[str, Any], inputs: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """(new inputs, a pruned request to install around generate() or None)."""
        kind, setting = rung
        if kind == "prune":
            if self._pruner is None:
                from memwarden.runtime.prune import VisualTokenPruner

                self._pruner = VisualTokenPruner(self.model)
            request = self._pruner.prune(inputs, keep_ratio=setting, method=self.config.prune_method)
            return dict(request.inputs), request
        if kind == "resolution":
            assert self.lower_resolution is not None
            return dict(self.lower_resolution(dict(inputs), setting)), None
        raise ValueError(f"unknown rung {kind!r}")

    def installed(self, pruned: Any) -> Any:
        """Context manager for one generate() call of a pruned request."""
        import contextlib

        if pruned is None or self._pruner is None:
            return contextlib.nullcontext()
        return self._pruner.applied(pruned)
