"""The admission side of a GovernedSession: predict a request's peak and walk the ladder.

A mixin of :class:`~memwarden.runtime.session.GovernedSession`: ``_predict`` adds what the session
holds and the request's own tensors to the meta-twin prediction; ``_admit`` either admits or makes
one change (drop cached encoder outputs, move KV blocks to the swap tier, stream weights, ask for
a quality rung, fall back, wait for a budget that may rise) and asks to be planned again, or
refuses with the reason.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from memwarden.runtime.admission import AdmissionError, Decision
from memwarden.units import format_bytes


class AdmissionMixin:
    """``_predict`` and ``_admit`` of a GovernedSession (state set by its ``__init__``)."""

    model: Any
    spec: Any
    pool: Any
    predictor: Any
    encoder_cache: Any
    ladder: Any
    fallback: Any
    on_decision: Any
    max_wait_s: float
    stream_allowed: bool
    activation_reserve_bytes: int
    held_bytes: int
    budget_bytes: int
    _user_blocks: int | None
    _request_tensors: list[torch.Tensor]
    _unpruned: tuple[torch.Tensor, int] | None
    _want_rung: bool
    _use_fallback: bool
    _budget_source: Any
    _budget_lowered: bool

    def _predict(self, new_ids: torch.Tensor, media_in: dict[str, Any], reuse: int, max_new_tokens: int) -> int:
        # The request's own tensors (ids, pixels, audio features) are alive throughout: count them.
        request_bytes = sum(t.numel() * t.element_size() for t in self._request_tensors)
        if self._unpruned is not None and media_in:
            # A pruned request: the meta twin has no pruner, so predict the unpruned prefill (the encoder
            # still sees the whole image) less the language model's per-token cost of the removed tokens.
            full_ids, removed = self._unpruned
            full = self.predictor.request_bytes(full_ids[:, reuse:], media_in, reuse, max_new_tokens)
            return self.held_bytes + request_bytes + max(0, full - self.predictor.per_token_bytes * removed)
        return self.held_bytes + request_bytes + self.predictor.request_bytes(new_ids, media_in, reuse, max_new_tokens)

    def _admit(self, new_ids: torch.Tensor, media_in: dict[str, Any], reuse: int, max_new_tokens: int,
               changes: list[str], start: float) -> Decision | None:  # fmt: skip
        """A decision, or None after one change that needs the request planned again.

        The ladder, cheapest first: drop cached encoder outputs; move cached KV blocks the
        request does not need to the swap tier (shrink the pool); wait for a moving budget to
        rise; refuse with the reason — never start a request predicted not to fit.
        """
        total_tokens = reuse + new_ids.shape[1] + max_new_tokens
        need_blocks = self.pool.blocks.blocks_needed(total_tokens)
        if need_blocks > self.pool.num_blocks and self._user_blocks is not None:
            raise AdmissionError(
                f"the request needs {total_tokens} tokens of KV cache, the pool holds "
                f"{self.pool.num_blocks * self.spec.block_size}: shorten it or give the session more KV blocks"
            )
        budget = self.budget_bytes
        predicted = self._predict(new_ids, media_in, reuse, max_new_tokens)
        if need_blocks > self.pool.num_blocks:  # a long request on a pool sized for less: grow it if the budget allows
            grown = predicted + (need_blocks - self.pool.num_blocks) * self.spec.page_size_bytes
            if grown <= budget:
                self._resize_pool(need_blocks, budget, "grow the KV pool to hold the request")
                changes.append(f"grew the KV pool to {need_blocks} blocks")
                return None
            raise AdmissionError(
                f"the request needs {total_tokens} tokens of KV cache ({format_bytes(grown - predicted)} more than the "
                f"pool holds) and the budget {format_bytes(budget)} has no room for them"
            )
        # Admission keeps a safety margin: the session's own bookkeeping (fingerprints, slot tables) and
        # the allocator's rounding are not in the prediction.
        if predicted > self._admissible(budget):
            if self.encoder_cache is not None and getattr(self.encoder_cache.store, "nbytes", 0):
                self.encoder_cache.store.clear()
                changes.append("dropped cached encoder outputs")
                return None
            spare_blocks = self.pool.num_blocks - need_blocks
            if spare_blocks > 0:
                page = self.spec.page_size_bytes
                drop = min(spare_blocks, -(-(predicted - self._admissible(budget)) // page))
                self._resize_pool(self.pool.num_blocks - drop, budget, "predicted peak above the budget")
                changes.append(f"moved {drop} KV blocks' worth of cache to the swap tier")
                return None
            restreams = sum(c.startswith("streamed weights") for c in changes)
            if self.stream_allowed and restreams < 3:
                # Weights give way to activations: stream (more of) them, planned for what this request lacks.
                self.activation_reserve_bytes = max(self.activation_reserve_bytes, 0) + (
                    predicted - self._admissible(budget)
                )
                self.activation_reserve_bytes += sum(t.numel() * t.element_size() for t in self._request_tensors)
                if self._restream(budget):
                    changes.append(f"streamed weights to leave {format_bytes(self.activation_reserve_bytes)} "
                                   "for activations")  # fmt: skip
                    return None
            rung_now = sum(1 for c in changes if c.split(" ")[0] in ("prune", "resolution"))
            if media_in and self.ladder.latency.level + rung_now < len(self.ladder.rungs):
                self._want_rung = True  # the next quality rung: fewer visual tokens, a smaller image
                return None
            if self.fallback is not None:
                self._use_fallback = True
                changes.append("fallback model")
                return None
            budget_may_rise = self._budget_source is not None or self._budget_lowered
            if budget_may_rise and time.perf_counter() - start < self.max_wait_s:
                time.sleep(0.01)
                poll = getattr(self._budget_source, "poll", None)
                if callable(poll):
                    poll()
                if "waited for the budget" not in changes:
                    changes.append("waited for the budget")
                return None
            raise AdmissionError(
                f"predicted peak {format_bytes(predicted)} exceeds the budget {format_bytes(budget)} less its safety "
                f"margin ({format_bytes(self._admissible(budget))}) even with the "
                "KV pool at the request's size: raise the budget, quantize (memwarden.quantize) or stream the weights"
            )
        action = "wait" if "waited for the budget" in changes else ("degrade" if changes else "admit")
        reason = "predicted peak within the budget" + (" after: " + "; ".join(changes) if changes else "")
        decision = Decision(action=action, predicted_peak_bytes=predicted, budget_bytes=budget, reason=reason,
                            changes=list(changes), waited_s=time.perf_counter() - start)  # fmt: skip
        self._note("admit", f"{action}: predicted {format_bytes(predicted)} of {format_bytes(budget)}",
                   budget_bytes=budget, predicted_peak_bytes=predicted, changes=list(changes))  # fmt: skip
        if self.on_decision is not None:
            self.on_decision(decision)
        return decision
