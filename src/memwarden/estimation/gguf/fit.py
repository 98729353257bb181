"""``--fit`` for a llama.cpp deployment: the largest context (``-c``) that fits a budget.

llama.cpp's own ``--fit`` (``tools/fit-params``) lowers ``-c`` and ``-ngl`` until its buffers fit
the devices' free memory. memwarden answers the same question from the headers, without loading
anything: every other flag as given, the context is searched in llama.cpp's own steps (it pads
``n_ctx`` to a multiple of 256, ``GGML_PAD(n_ctx, 256)`` in ``llama_context``), from 256 to the
model's training context. The verdict at each step is the plain estimate's (``LlamaCppEstimate.
fits``): one source of truth, so the answer fed back to ``estimate`` fits and the next step up
does not. The KV cache and the compute buffers grow with the context, so the search is a
bisection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memwarden.estimation.gguf.estimate import LlamaCppEstimate

__all__ = ["CTX_STEP", "ContextFit", "fit_context"]

CTX_STEP = 256  # llama.cpp pads n_ctx to a multiple of 256


@dataclass(frozen=True)
class ContextFit:
    """The frontier: ``n_ctx`` fits (None: not even the smallest context does), ``next_ctx`` (one
    step up) does not (None: the model's whole training context fits)."""

    n_ctx: int | None
    at: LlamaCppEstimate  # the estimate at the answer (at the smallest context when none fits)
    next_ctx: int | None
    next: LlamaCppEstimate | None

    def to_json(self) -> dict[str, Any]:
        return {
            "solve": "context",
            "value": self.n_ctx,
            "peak_bytes": self.at.peak_bytes,
            "judged_bytes": self.at.judged_bytes,
            "budget_bytes": self.at.budget_bytes,
            "next_value": self.next_ctx,
            "next_judged_bytes": self.next.judged_bytes if self.next is not None else None,
        }


def fit_context(estimate: Callable[[int], LlamaCppEstimate], n_ctx_max: int, n_ctx_min: int = 1) -> ContextFit:
    """The largest multiple of ``CTX_STEP`` from ``n_ctx_min`` (the request's image tokens must fit
    the context: llama.cpp refuses a smaller one) up to ``n_ctx_max`` whose ``estimate(n_ctx)``
    fits. ``estimate`` must judge against a budget (its ``fits`` is not None)."""
    bottom = -(-max(n_ctx_min, 1) // CTX_STEP) * CTX_STEP
    top = max(bottom, n_ctx_max - n_ctx_max % CTX_STEP)
    lo_est = estimate(bottom)
    if lo_est.fits is None:
        raise ValueError("--fit needs a budget or a device profile to judge against")
    if not lo_est.fits:
        return ContextFit(None, lo_est, bottom, lo_est)
    top_est = estimate(top)
    if top_est.fits:
        return ContextFit(top, top_est, None, None)
    lo, hi = bottom // CTX_STEP, top // CTX_STEP  # in steps: lo fits, hi does not
    best, above = lo_est, top_est
    while hi - lo > 1:
        mid = (lo + hi) // 2
        est = estimate(mid * CTX_STEP)
        if est.fits:
            lo, best = mid, est
        else:
            hi, above = mid, est
    return ContextFit(lo * CTX_STEP, best, hi * CTX_STEP, above)
