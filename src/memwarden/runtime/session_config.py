"""SessionConfig: the knobs of a GovernedSession as one frozen value.

A session is built from objects (the model, its processor, a budget or a telemetry budget source, a
fallback session, :class:`SessionHooks`) and from knobs — numbers and switches that say how much
memory goes where. The knobs live here and only here, so that a deployment can keep one
``SessionConfig`` and build sessions from it, compare two, or log it; one is changed with
``dataclasses.replace(config, kv_fraction=0.25)``. Adding a knob is adding a field below: the
session reads ``config.<field>`` where it needs it.

Until the next release ``GovernedSession`` also takes every knob and hook as its old keyword:
:func:`from_legacy_keywords` maps each onto the config or the hooks with a ``DeprecationWarning``
that names the new spelling.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

from memwarden.runtime.degrade import LadderConfig
from memwarden.runtime.session_hooks import SessionHooks
from memwarden.units import parse_bytes


@dataclass(frozen=True, kw_only=True)
class SessionConfig:
    """How a GovernedSession spends its budget; every default is the session's historical one."""

    # The session's fixed budget, set from its budget argument; beside a budget source, a cap on it (None: no cap).
    budget: str | int | None = None
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
    take_over: bool = True  # a model governed by another session: close that one (False: ModelGovernedError)

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


_HOOKS = ("on_decision", "lower_resolution")
_DROPPED = ("device_profile",)  # never read by the session


def from_legacy_keywords(
    config: SessionConfig, hooks: SessionHooks, legacy: dict[str, object]
) -> tuple[SessionConfig, SessionHooks]:
    """``config`` and ``hooks`` with the keywords of the old ``GovernedSession`` signature applied, each
    with a DeprecationWarning naming its new spelling; TypeError for a keyword it never took."""
    knobs = {f.name for f in dataclasses.fields(SessionConfig)} - {"budget"}
    unknown = sorted(set(legacy) - knobs - set(_HOOKS) - set(_DROPPED))
    if unknown:
        raise TypeError(f"GovernedSession got unexpected keyword arguments: {', '.join(unknown)}")
    config_changes: dict[str, Any] = {}
    hook_changes: dict[str, Any] = {}
    for name, value in legacy.items():
        if name in _DROPPED:
            new = f"nothing: the session never read {name}, drop it"
        elif name == "encoder_cache" and not isinstance(value, bool):  # a store object, not the switch
            hook_changes["encoder_store"], config_changes[name] = value, True
            new = "hooks=SessionHooks(encoder_store=...)"
        elif name in _HOOKS:
            hook_changes[name] = value
            new = f"hooks=SessionHooks({name}=...)"
        else:
            config_changes[name] = value
            new = f"config=dataclasses.replace(config, {name}=...)"
        message = f"GovernedSession({name}=...) is deprecated and goes in the next release: pass {new}"
        warnings.warn(message, DeprecationWarning, stacklevel=3)
    return dataclasses.replace(config, **config_changes), dataclasses.replace(hooks, **hook_changes)


__all__ = ["SessionConfig", "from_legacy_keywords"]
