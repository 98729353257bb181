"""Admission of one request in a GovernedSession: predict its peak, and decide.

:class:`Admission` holds the peak predictor and asks the session's memory what it holds and what
the budget is. :meth:`Admission.step` looks at a request's current plan and returns one
:class:`AdmissionAnswer`; it changes nothing. The serving loop acts on the answer (resizes the
pool, drops cached encoder outputs, streams weights, moves to a quality rung, hands the request to
the fallback, waits, or raises ``AdmissionError``) and, unless it admitted or handed over, plans
the request again and asks again.

Every change makes progress, so admission ends: cached encoder outputs are dropped at most once per
quality rung (pruning scores visual tokens with the vision encoder, which refills the cache: dropping
it again and again was a livelock), the pool only shrinks to what the request needs (or grows once to
it), weights are streamed at most three times, rungs and the fallback are finite; waiting ends at
``max_wait_s``, and so does a request still changing past it (refused with the changes tried).

The ladder, cheapest first: drop cached encoder outputs; move cached KV blocks the request does
not need to the swap tier (shrink the pool); stream (more of) the weights; a quality rung (fewer
visual tokens, a smaller image); the fallback model; wait for a moving budget to rise; refuse with
the reason — never start a request predicted not to fit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from memwarden.runtime.admission import AdmissionError, Decision, PeakPredictor
from memwarden.runtime.degrade import Ladder
from memwarden.runtime.session_memory import SessionMemory
from memwarden.runtime.session_request import Request, RequestPlan
from memwarden.units import format_bytes

DecisionKind = Literal["admit", "change", "wait", "refuse"]
Change = Literal["resize_pool", "drop_encoder_outputs", "stream_weights", "rung", "fallback"]
# Why a request was refused, in a word that stays put (a metric label; the reason's text carries the figures):
# a request longer than a fixed KV pool, KV the budget has no room for, no plan within max_wait_s, a peak
# above the budget with every change tried.
Refusal = Literal["kv_pool_fixed", "kv_pool_budget", "max_wait", "over_budget"]

_WAIT_S = 0.01  # between two looks at a budget that may rise


@dataclass(frozen=True, kw_only=True)
class AdmissionAnswer:
    """One admission step's answer for one request (not the :class:`Decision` the session records
    and reports: an admit answer carries that as ``record``).

    - ``admit``: run it; ``record`` is what the session reports for it;
    - ``change``: change the plan (``change`` says how: resize the pool to ``pool_blocks``, drop
      cached encoder outputs, stream weights leaving ``reserve_bytes`` for activations, serve at
      quality ``rung``, or hand it to the fallback), then plan again; ``label`` is the change as the
      request's record lists it;
    - ``wait``: look again after ``wait_s`` (the budget may rise);
    - ``refuse``: ``reason`` is the ``AdmissionError`` message, ``refusal`` its short name.
    """

    kind: DecisionKind
    reason: str
    budget_bytes: int
    predicted_peak_bytes: int | None = None  # None where the step refused before predicting
    change: Change | None = None
    label: str = ""
    pool_blocks: int | None = None
    reserve_bytes: int | None = None
    rung: int | None = None
    wait_s: float = 0.0
    record: Decision | None = None
    refusal: Refusal | None = None


class Admission:
    """Peak prediction and the admission ladder of one session; see the module docstring."""

    def __init__(
        self, predictor: PeakPredictor, memory: SessionMemory, ladder: Ladder, *, has_fallback: bool, max_wait_s: float
    ) -> None:
        self.predictor = predictor
        self.memory = memory
        self.ladder = ladder
        self.has_fallback = has_fallback
        self.max_wait_s = max_wait_s

    def predict(self, plan: RequestPlan, max_new_tokens: int) -> int:
        """Predicted peak bytes of serving ``plan`` now: what the session holds, the request's own
        tensors, and the transient bytes of its prefill and decode."""
        held = self.memory.held_bytes + plan.tensor_bytes
        if plan.unpruned is not None and plan.media_in:
            # A pruned request: the meta twin has no pruner, so predict the unpruned prefill (the encoder
            # still sees the whole image) less the language model's per-token cost of the removed tokens.
            full_ids, removed = plan.unpruned
            reuse = plan.reuse_tokens
            full = self.predictor.request_bytes(full_ids[:, reuse:], plan.media_in, reuse, max_new_tokens)
            return held + max(0, int(full - self.predictor.per_token_bytes * removed))
        return held + self.predictor.request_bytes(plan.new_ids, plan.media_in, plan.reuse_tokens, max_new_tokens)

    def step(self, request: Request, plan: RequestPlan) -> AdmissionAnswer:
        """The decision for ``request`` served as ``plan``, given what the session holds now."""
        memory, pool, spec = self.memory, self.memory.pool, self.memory.spec
        total_tokens = plan.reuse_tokens + plan.new_ids.shape[1] + request.max_new_tokens
        need_blocks = pool.blocks.blocks_needed(total_tokens)
        budget = memory.budget_bytes
        if need_blocks > pool.num_blocks and memory.config.num_kv_blocks is not None:
            return AdmissionAnswer(
                kind="refuse",
                refusal="kv_pool_fixed",
                budget_bytes=budget,
                reason=(
                    f"the request needs {total_tokens} tokens of KV cache, the pool holds "
                    f"{pool.num_blocks * spec.block_size}: shorten it or give the session more KV blocks"
                ),
            )
        predicted = self.predict(plan, request.max_new_tokens)
        if need_blocks > pool.num_blocks:  # a long request on a pool sized for less: grow it if the budget allows
            grown = predicted + (need_blocks - pool.num_blocks) * spec.page_size_bytes
            if grown <= budget:
                return AdmissionAnswer(
                    kind="change",
                    change="resize_pool",
                    pool_blocks=need_blocks,
                    reason="grow the KV pool to hold the request",
                    label=f"grew the KV pool to {need_blocks} blocks",
                    budget_bytes=budget,
                    predicted_peak_bytes=predicted,
                )
            if memory.stream_allowed and memory.streamer is None and not request.streaming_failed:
                # Resident weights give way to the cache the request needs (stream="auto" kept them resident
                # while they fitted beside one block): stream them, planned for this request, then grow.
                reserve = max(memory.activation_reserve_bytes, grown - memory.held_bytes)
                return AdmissionAnswer(
                    kind="change",
                    change="stream_weights",
                    reserve_bytes=reserve,
                    reason="the KV pool cannot grow beside resident weights",
                    label=f"streamed weights to leave {format_bytes(reserve)} for the request",
                    budget_bytes=budget,
                    predicted_peak_bytes=predicted,
                )
            return AdmissionAnswer(
                kind="refuse",
                refusal="kv_pool_budget",
                budget_bytes=budget,
                predicted_peak_bytes=predicted,
                reason=(
                    f"the request needs {total_tokens} tokens of KV cache ({format_bytes(grown - predicted)} more than the "
                    f"pool holds) and the budget {format_bytes(budget)} has no room for them"
                ),
            )
        # Admission keeps a safety margin: the session's own bookkeeping (fingerprints, slot tables) and
        # the allocator's rounding are not in the prediction.
        admissible = memory.admissible(budget)
        if predicted <= admissible:
            return self._admit(request, predicted, budget)
        over = predicted - admissible

        def change(
            what: Change,
            label: str,
            *,
            pool_blocks: int | None = None,
            reserve_bytes: int | None = None,
            rung: int | None = None,
        ) -> AdmissionAnswer:
            return AdmissionAnswer(
                kind="change",
                change=what,
                label=label,
                reason="predicted peak above the budget",
                budget_bytes=budget,
                predicted_peak_bytes=predicted,
                pool_blocks=pool_blocks,
                reserve_bytes=reserve_bytes,
                rung=rung,
            )

        waited_s = time.perf_counter() - request.start_s
        if request.changes and waited_s > self.max_wait_s:
            return AdmissionAnswer(
                kind="refuse",
                refusal="max_wait",
                budget_bytes=budget,
                predicted_peak_bytes=predicted,
                reason=(
                    f"no plan fits within max_wait_s={self.max_wait_s:g} s: predicted peak {format_bytes(predicted)} "
                    f"exceeds the budget {format_bytes(budget)} less its safety margin ({format_bytes(admissible)}) "
                    f"after: {'; '.join(request.changes)}"
                ),
            )
        if memory.encoder_outputs_bytes and request.encoder_drops <= request.rungs_taken:
            return change("drop_encoder_outputs", "dropped cached encoder outputs")
        spare_blocks = pool.num_blocks - need_blocks
        if spare_blocks > 0:
            drop = min(spare_blocks, -(-over // spec.page_size_bytes))
            return change(
                "resize_pool",
                f"moved {drop} KV blocks' worth of cache to the swap tier",
                pool_blocks=pool.num_blocks - drop,
            )
        if memory.stream_allowed and request.restreams < 3 and not request.streaming_failed:
            # Weights give way to activations: stream (more of) them, planned for what this request lacks.
            reserve = max(memory.activation_reserve_bytes, 0) + over + plan.tensor_bytes
            return change(
                "stream_weights",
                f"streamed weights to leave {format_bytes(reserve)} for activations",
                reserve_bytes=reserve,
            )
        if plan.media_in and self.ladder.latency.level + request.rungs_taken < len(self.ladder.rungs):
            kind, setting = self.ladder.rungs[request.rung]  # the next rung: fewer visual tokens, a smaller image
            return change("rung", f"{kind} {setting}", rung=request.rung + 1)
        if self.has_fallback:
            return change("fallback", "fallback model")
        if memory.budget_may_rise and time.perf_counter() - request.start_s < self.max_wait_s:
            return AdmissionAnswer(
                kind="wait",
                wait_s=_WAIT_S,
                budget_bytes=budget,
                predicted_peak_bytes=predicted,
                reason="the budget may rise: waiting for it",
            )
        return AdmissionAnswer(
            kind="refuse",
            refusal="over_budget",
            budget_bytes=budget,
            predicted_peak_bytes=predicted,
            reason=(
                f"predicted peak {format_bytes(predicted)} exceeds the budget {format_bytes(budget)} less its safety "
                f"margin ({format_bytes(admissible)}) even with the "
                "KV pool at the request's size: raise the budget, quantize (memwarden.quantize) or stream the weights"
            ),
        )

    def refuse(self, decision: AdmissionAnswer) -> AdmissionError:
        """Record a ``refuse`` decision the serving loop carries out, and return the error it raises.

        The record is a ``refuse`` entry in the session's log (its label the reason's text, ``reason``
        its short name): ``stats()["refusals"]`` and the refusal metric count it by that name. Only
        here, not in ``step``: a step is also asked for a preview (``admission_step``), which refuses
        nothing."""
        self.memory.log.note(
            "refuse",
            decision.reason,
            reason=decision.refusal or "refused",
            budget_bytes=decision.budget_bytes,
            predicted_peak_bytes=decision.predicted_peak_bytes,
        )
        from memwarden.record.live.ring import dump_on_refusal  # a running flight recorder writes its window

        dump_on_refusal(decision.reason)
        return AdmissionError(decision.reason)

    def _admit(self, request: Request, predicted: int, budget: int) -> AdmissionAnswer:
        changes = request.changes
        action = "wait" if "waited for the budget" in changes else ("degrade" if changes else "admit")
        reason = "predicted peak within the budget" + (" after: " + "; ".join(changes) if changes else "")
        record = Decision(
            action=action,
            predicted_peak_bytes=predicted,
            budget_bytes=budget,
            reason=reason,
            changes=list(changes),
            waited_s=time.perf_counter() - request.start_s,
        )
        return AdmissionAnswer(
            kind="admit", reason=reason, budget_bytes=budget, predicted_peak_bytes=predicted, record=record
        )


def apply_change(decision: AdmissionAnswer, request: Request, memory: SessionMemory) -> None:
    """Carry out a ``change`` decision other than the fallback (the caller holds the session's lock)."""
    tried_streaming = False
    if decision.change == "resize_pool":
        assert decision.pool_blocks is not None
        memory.resize_pool(decision.pool_blocks, decision.budget_bytes, decision.reason)
    elif decision.change == "drop_encoder_outputs":
        memory.drop_encoder_outputs()
    elif decision.change == "stream_weights":
        assert decision.reserve_bytes is not None
        memory.activation_reserve_bytes = decision.reserve_bytes
        tried_streaming = not memory.restream(decision.budget_bytes)
    elif decision.change == "rung":
        assert decision.rung is not None
        request.rung = decision.rung
    if not tried_streaming:
        request.changes.append(decision.label)
    request.streaming_failed = tried_streaming  # admission skips streaming only right after it freed nothing


__all__ = ["Admission", "AdmissionAnswer", "Refusal", "apply_change"]
