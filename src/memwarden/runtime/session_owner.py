"""One governing session per model, and what ``close()`` gives back.

A GovernedSession changes the model it serves: it may stream its weights (placeholders and
hooks, ``runtime/offload.py``), wrap its encoders (``runtime/encoders.py``) and quantize it in
place (``runtime/quant.py``). Two sessions doing that to one model at once would stream
placeholders and wrap wrappers, so a model has at most one governing session. The model keeps a
weak reference to it (``_memwarden_session``): a session that is collected without ``close()``
releases the model through its finalizer and no longer counts.

A new session on a governed model takes it over — the old one is closed first (weights brought
back, hooks removed) and refuses requests after — unless it is created with ``take_over=False``,
where it raises :class:`ModelGovernedError` saying exactly what to do.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from memwarden.errors import MemwardenError

GOVERNED = "close the GovernedSession that governs this model"


class ModelGovernedError(MemwardenError, RuntimeError):
    """The model already has a governing session and the new one was told not to take it over."""


@dataclass(frozen=True, kw_only=True)
class Restored:
    """The model as ``close()`` left it: what came back and what could not be undone."""

    weights_resident: bool  # no parameter is a streaming placeholder any more
    streamed_weights_restored: bool  # the session had streamed weights and brought them back
    hooks_removed: bool  # no streaming hook nor encoder wrapper of the session is left on the model
    quantized_bits: int | None  # int4 linears stay: quantization is in place and is not undone
    quantized_layers: int

    def describe(self) -> str:
        parts = ["weights resident" if self.weights_resident else "WEIGHTS NOT RESIDENT"]
        if self.streamed_weights_restored:
            parts[0] += " (streamed weights brought back)"
        parts.append("hooks removed" if self.hooks_removed else "HOOKS LEFT")
        if self.quantized_bits is not None:
            parts.append(
                f"{self.quantized_layers} linear layers stay int{self.quantized_bits}-quantized: "
                "quantization is in place and not undone (reload the model for its original weights)"
            )
        return "; ".join(parts)


def governing_session(model: torch.nn.Module) -> Any | None:
    """The open session that governs ``model``, or None."""
    ref = getattr(model, "_memwarden_session", None)
    session = ref() if callable(ref) else None
    return None if session is None or session.closed else session


def claim(model: torch.nn.Module, session: Any, *, take_over: bool) -> Any | None:
    """Make ``session`` the model's governing session; returns the session it took over (closed), if any."""
    old = governing_session(model)
    if old is not None and old is not session:
        if not take_over:
            raise ModelGovernedError(
                f"this model is already governed by a GovernedSession: {GOVERNED} (session.close()), "
                "or create the new one with take_over=True"
            )
        old.close(reason="taken over by a new GovernedSession on the same model")
    elif getattr(model, "_memwarden_streamer", None) is not None:
        raise ModelGovernedError(
            "this model's weights are streamed by a WeightStreamer made outside a GovernedSession: detach() that "
            "streamer first"
        )
    model._memwarden_session = weakref.ref(session)  # type: ignore[assignment]
    return old


def release(model: torch.nn.Module, session: Any) -> None:
    """``session`` no longer governs ``model`` (it was closed)."""
    ref = getattr(model, "_memwarden_session", None)
    if callable(ref) and ref() is session:
        model._memwarden_session = None  # type: ignore[assignment]


def restored(model: torch.nn.Module, *, had_streamer: bool, bits: int | None) -> Restored:
    """What ``close()`` left on ``model``, checked on the model itself (not assumed)."""
    from memwarden.runtime.quant import Int4Linear

    placeholders = any(
        p.untyped_storage().nbytes() < p.numel() * p.element_size()
        for p in model.parameters()
        if p.device.type != "meta"
    )
    wrapped = any(hasattr(m, "_memwarden_encoder_name") and "forward" in vars(m) for m in model.modules())
    quantized = sum(isinstance(m, Int4Linear) for m in model.modules())
    return Restored(
        weights_resident=not placeholders,
        streamed_weights_restored=had_streamer and not placeholders,
        hooks_removed=getattr(model, "_memwarden_streamer", None) is None and not wrapped,
        quantized_bits=(bits or 4) if quantized else None,
        quantized_layers=quantized,
    )


__all__ = ["GOVERNED", "ModelGovernedError", "Restored", "claim", "governing_session", "release", "restored"]
