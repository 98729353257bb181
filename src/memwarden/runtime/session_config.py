"""SessionConfig: the knobs of a GovernedSession as one frozen value.

A session is built from objects (the model, its processor, a telemetry budget source, a fallback
session, callbacks) and from knobs — numbers and switches that say how much memory goes where.
The knobs live here, so that a deployment can keep one ``SessionConfig`` and build sessions from
it, compare two, or log it. ``GovernedSession`` still takes every knob as a keyword: the keywords
build a config (:func:`resolve_config`), and a keyword given beside ``config=`` must agree with it.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from memwarden.runtime.degrade import LadderConfig
from memwarden.units import parse_bytes


class Unset(enum.Enum):
    """A keyword the caller did not pass: ``None`` is a real value of several knobs, so it cannot mean that."""

    UNSET = "unset"


UNSET = Unset.UNSET


@dataclass(frozen=True, kw_only=True)
class SessionConfig:
    """How a GovernedSession spends its budget; every default is the session's historical one."""

    budget: str | int | None = "6GiB"  # fixed budget; None: only a budget source (telemetry) limits
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int | None = None  # a fixed pool; None: kv_fraction of what the weights leave
    kv_fraction: float = 0.5  # of the budget left after the weights, what goes to the KV pool
    prefix_reuse: bool = True
    encoder_cache: bool = True  # cache encoder outputs (keyed by media content)
    encoder_cache_bytes: int = 64 * 1024**2
    max_wait_s: float = 30.0  # how long a request waits for a budget that may rise before it is refused
    swap_dir: str | None = None  # where KV blocks go when the pool shrinks (None: the temp dir)
    stream: bool | str = "auto"  # stream weights from disk: True, False, or "auto" (when they do not fit)
    offload_dir: str | None = None  # where streamed weights are kept (None: a new temp dir)
    activation_reserve_bytes: int | None = None  # None: a tenth of the budget, or what example_inputs need
    min_kv_tokens: int = 1024  # the smallest pool, in tokens
    safety_fraction: float = 0.03  # of the budget kept free of predictions (kernel workspaces, rounding)
    quantize: int | None = None  # weight-only quantization bits (runtime/quant.py); None: as loaded
    group_size: int = 128  # quantization group, in weights
    ladder: LadderConfig | None = None  # the degradation ladder's settings (None: LadderConfig())
    heap_mmap_threshold: int | None = 128 * 1024  # glibc's fixed mmap threshold on CPU; None: leave it
    cuda_reserve_cap: bool = True  # on a GPU, hold the allocator's reserve to the budget (runtime/cuda_reserve.py)

    def __post_init__(self) -> None:
        if self.budget is not None and not isinstance(self.budget, str):
            # A number of bytes in any numeric form (float, numpy, 0-dim tensor) is stored as an int;
            # anything else is a TypeError naming it (parse_bytes), never taken for "no limit".
            object.__setattr__(self, "budget", parse_bytes(self.budget))
        elif self.budget is not None:
            parse_bytes(self.budget)  # raises with the accepted forms
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be an int of at least 1, not {self.block_size!r}")
        for name, lo, hi in (("kv_fraction", 0.0, 1.0), ("safety_fraction", 0.0, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
                raise ValueError(f"{name} must be a number in [{lo:g}, {hi:g}], not {value!r}")
        wait = self.max_wait_s
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < float("inf"):
            raise ValueError(f"max_wait_s must be a finite number of seconds >= 0, not {wait!r}")
        for name in ("num_kv_blocks", "min_kv_tokens", "encoder_cache_bytes", "activation_reserve_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative int, not {value!r}")

    @property
    def fixed_budget_bytes(self) -> int | None:
        """The fixed budget in bytes, or None when only a budget source limits the session."""
        return None if self.budget is None else parse_bytes(self.budget)


def budget_source_of(budget: Any) -> Any:
    """The budget source ``budget`` is (an object with ``budget_bytes``: a telemetry controller), or
    None when it is a quantity of bytes (or not given). Raises TypeError, naming what was given, for
    anything that is neither: ``None`` (no limit) or a list is never taken for a controller."""
    if budget is UNSET or budget is None or isinstance(budget, str):
        return None
    if hasattr(budget, "budget_bytes") and not isinstance(budget, type):
        return budget
    parse_bytes(budget)  # TypeError / ValueError for what is not a quantity of bytes
    return None


KNOBS = tuple(f.name for f in dataclasses.fields(SessionConfig))


def resolve_config(config: SessionConfig | None, keywords: dict[str, Any]) -> SessionConfig:
    """The config a session runs with: ``config``, or one built from the knob keywords given.

    ``keywords`` maps knob names to values, ``UNSET`` for a keyword the caller did not pass. Beside
    ``config=`` a keyword may only repeat the config's value: two different answers to one question
    are refused rather than one silently winning."""
    unknown = sorted(set(keywords) - set(KNOBS))
    if unknown:
        raise TypeError(f"unknown session knobs: {', '.join(unknown)}")
    given = {name: value for name, value in keywords.items() if value is not UNSET}
    if config is None:
        return SessionConfig(**given)
    conflicts = [f"{name}={value!r} (config has {getattr(config, name)!r})"
                 for name, value in given.items() if not _same(name, value, getattr(config, name))]  # fmt: skip
    if conflicts:
        raise TypeError(
            f"GovernedSession got config= and keywords that disagree with it: {', '.join(conflicts)}; "
            "pass each knob once (dataclasses.replace(config, ...) makes a changed config)"
        )
    return config


def _same(name: str, given: Any, configured: Any) -> bool:
    if name == "budget" and given is not None and configured is not None:
        return bool(parse_bytes(given) == parse_bytes(configured))  # "1GiB" and 1073741824 agree
    return bool(given == configured)


__all__ = ["KNOBS", "UNSET", "SessionConfig", "Unset", "budget_source_of", "resolve_config"]
