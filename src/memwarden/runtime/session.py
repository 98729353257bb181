"""GovernedSession: serve a transformers VLM / audio-LM under a memory budget.

The session owns the memory a plain ``model.generate()`` would grow without limit:

- one paged KV pool (``runtime/kvcache.py``) sized at start within the budget, shared by all
  requests and conversations, with content-hash prefix reuse (``runtime/blocks.py``): a
  conversation's next turn, or another request about the same image, finds its prefix's KV in
  the pool and prefills only what is new — the image is neither re-encoded nor re-prefilled;
- an encoder output cache (``runtime/encoders.py``) for the same media after a different prefix;
- admission control (``runtime/admission.py``, ``runtime/session_admit.py``): before a request
  runs its peak is predicted on a meta twin of the model; a request that does not fit waits for
  the budget to come back or is degraded, and the decision is recorded.

The session is composed, not mixed in: it holds a :class:`SessionMemory` (budget, held bytes,
pool sizing, weight streaming) and an :class:`Admission` (the predictor and the ladder), asks
them questions, and acts on the answers — an admission step returns an ``AdmissionAnswer``
value and the serving loop below carries it out. Each request's state is its own ``Request``.

Generation itself is the model's own ``generate()`` on the session's cache, so decoding is exactly
transformers'; greedy outputs equal plain ``model.generate()`` token for token (tests).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import warnings
from typing import Any

import torch

from memwarden.govern.budget_value import Budget, BudgetSource
from memwarden.runtime import media as media_mod
from memwarden.runtime.admission import PeakPredictor
from memwarden.runtime.degrade import Ladder
from memwarden.runtime.encoders import EncoderCache
from memwarden.runtime.host_memory import allocation_failed, first_line
from memwarden.runtime.kvcache import KVPool, PagedCache, Sequence, cache_keyword
from memwarden.runtime.session_admit import Admission, AdmissionAnswer, apply_change
from memwarden.runtime.session_chat import Conversation
from memwarden.runtime.session_config import SessionConfig, from_legacy_keywords
from memwarden.runtime.session_hooks import SessionHooks
from memwarden.runtime.session_inputs import check_request, join_rows, split_rows
from memwarden.runtime.session_log import EventLog
from memwarden.runtime.session_memory import SessionMemory
from memwarden.runtime.session_model import prefix_reuse, prepare_model
from memwarden.runtime.session_owned import BudgetError
from memwarden.runtime.session_owner import Restored, claim, release, restored
from memwarden.runtime.session_request import FirstTokenStreamer, Request, RequestPlan, RequestRecord
from memwarden.runtime.session_tally import SessionTally
from memwarden.units import format_bytes

DEFAULT_CONFIG = SessionConfig()  # frozen, so one shared default is safe
NO_HOOKS = SessionHooks()
_LIMIT_RETRIES = 3  # a request served again at most this often after the real limit refused an allocation


class GovernedSession:
    """Serve ``model`` under ``budget``: bytes (``"6GiB"``, an int) or a :class:`BudgetSource`.

    A budget source (a ``govern.budget`` controller following telemetry) is read before every
    request; ``config.budget``, when set, caps it. ``config.kv_fraction`` of what the budget leaves
    after the weights goes to the KV pool (unless ``config.num_kv_blocks`` is given), the rest to
    activations; ``example_inputs`` (a request like those to come) sizes the activation reserve.
    On CPU the session fixes glibc's mmap threshold at ``config.heap_mmap_threshold`` bytes
    (process-wide; ``None`` leaves it alone) so that freed activations leave the resident set that a
    device's memory killer watches.

    The knobs are the frozen :class:`SessionConfig` (``dataclasses.replace`` changes one), the
    caller's callbacks and encoder store one :class:`SessionHooks`. ``fallback`` is a session over a
    smaller model that serves what this one cannot (the ladder's last rung). The old keyword of
    every knob and hook still works until the next release, with a ``DeprecationWarning``.

    A model has at most one governing session (``runtime/session_owner.py``): a session created on a
    governed model closes the old one and takes over, or with ``config.take_over=False`` raises
    ``ModelGovernedError`` ("close the GovernedSession that governs this model").
    """

    def __init__(
        self,
        model: torch.nn.Module,
        budget: int | str | BudgetSource,
        *,
        config: SessionConfig = DEFAULT_CONFIG,
        processor: Any = None,
        hooks: SessionHooks = NO_HOOKS,
        fallback: GovernedSession | None = None,
        example_inputs: dict[str, Any] | None = None,
        **legacy: Any,  # the old keywords, one release: from_legacy_keywords
    ) -> None:
        if legacy:
            config, hooks = from_legacy_keywords(config, hooks, legacy)
        # Parsed once, here (TypeError for what is neither bytes nor a source); config.budget caps a source.
        parsed = Budget.parse(budget, cap=config.budget)
        if parsed.source is None:
            config = dataclasses.replace(config, budget=parsed.fixed_bytes)
        self.config = config
        self.hooks = hooks
        self.model: Any = model  # a transformers model: generate(), config, generation_config are not nn.Module's
        self.closed = False
        self.restored: Restored | None = None  # what close() left on the model
        self.log = EventLog()  # budget changes, pool resizes, degradations: what and why
        self.processor = processor
        self.ladder = Ladder(model, config.ladder, hooks.lower_resolution)
        self.fallback = fallback  # rung 4: a session over a smaller language model the user registered
        self._lock = threading.Lock()  # one request admitted and served at a time; pool resizes wait for it
        self._ids = itertools.count()
        self.records: list[RequestRecord] = []
        self.tally = SessionTally()  # counts over records and events, kept as they grow: stats() without the lists
        self.conversations: dict[str, Conversation] = {}
        # Said once, here: a family whose cached prefix cannot be reused whole (stats() repeats why).
        self.prefix_reuse_off_reason, self._mrope = prefix_reuse(model, config)
        if self.prefix_reuse_off_reason is not None and config.prefix_reuse:
            warnings.warn(f"GovernedSession: {self.prefix_reuse_off_reason}", UserWarning, stacklevel=2)

        # before touching the model: the old one restores it
        if claim(model, self, take_over=config.take_over) is not None:
            self.log.note("session", "took the model over from an earlier GovernedSession (closed it first)")
        if self.prefix_reuse_off_reason is not None:
            self.log.note("session", f"prefix reuse limited: {self.prefix_reuse_off_reason}")
        try:
            self.device, self.spec = prepare_model(model, config)
            self.predictor = PeakPredictor(model, self.spec)
            self.memory = SessionMemory(
                model,
                self.spec,
                self.predictor,
                config,
                self.log,
                device=self.device,
                budget=parsed,
                example_inputs=example_inputs,
                encoder_store=hooks.encoder_store,
                processor=processor,
            )
        except BaseException as exc:  # a session that failed to start governs nothing
            self.closed = True
            release(model, self)
            if isinstance(exc, RuntimeError | MemoryError) and allocation_failed(exc):
                raise BudgetError(
                    f"this process's memory limit left no room to set the session up ({first_line(exc)}):"
                    " raise the limit, or quantize the weights (memwarden.quantize)"
                ) from exc
            raise
        self.admission = Admission(
            self.predictor, self.memory, self.ladder, has_fallback=fallback is not None, max_wait_s=config.max_wait_s
        )

    def close(self, reason: str = "closed") -> Restored:
        """Restore the model — streamed weights brought back, hooks and encoder wrappers removed — and
        release it (another session may govern it); returns what was restored, checked on the model,
        and logs it. In-place quantization cannot be undone: it is reported. Idempotent."""
        if self.restored is not None:
            return self.restored
        self.closed = True
        with self._lock:  # not under a request being served
            had_streamer = self.memory.streamer is not None
            self.memory.close()
            release(self.model, self)
        self.restored = restored(self.model, had_streamer=had_streamer, bits=self.config.quantize)
        self.log.note("session", f"{reason}: {self.restored.describe()}")
        return self.restored

    def __enter__(self) -> GovernedSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            why = self.events[-1]["label"] if self.events else "closed"
            raise RuntimeError(f"this GovernedSession is closed ({why}): create a new one to serve with")

    # -- what the session holds (asked of its memory) -------------------------------------

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.log.events

    @property
    def pool(self) -> KVPool:
        return self.memory.pool

    @property
    def encoder_cache(self) -> EncoderCache | None:
        return self.memory.encoder_cache

    @property
    def streamer(self) -> Any:
        return self.memory.streamer

    @property
    def weights_bytes(self) -> int:
        return self.memory.weights_bytes

    @property
    def activation_reserve_bytes(self) -> int:
        return self.memory.activation_reserve_bytes

    @property
    def budget_bytes(self) -> int:
        return self.memory.budget_bytes

    @property
    def held_bytes(self) -> int:
        """Bytes the session holds between requests: weights, the KV pool, cached encoder outputs."""
        return self.memory.held_bytes

    @property
    def working_set_bytes(self) -> int:
        """The least the session serves with: its weights, the smallest KV pool and the activation reserve."""
        return self.memory.working_set_bytes

    def pool_blocks_for_tokens(self, num_tokens: int) -> int:
        return self.memory.pool_blocks_for_tokens(num_tokens)

    # -- the budget -----------------------------------------------------------------------

    def set_budget(self, budget: str | int, *, temporary: bool = False) -> None:
        """A new fixed budget; the pool follows before the next request.

        ``temporary=True`` (a squeeze that will end): the session makes no allocation while the
        budget is below what it holds — requests wait for it to come back (up to ``max_wait_s``)
        rather than resize under a limit that may refuse even the resize."""
        if self.memory.set_budget(budget, temporary=temporary):
            self.follow_budget()

    def on_telemetry(self, sample: Any, *, in_use_bytes: int | None = None) -> int:
        """Feed one telemetry sample to the session's budget controller (created on first use,
        capped at the fixed budget); returns the budget it implies.

        ``in_use_bytes``: what the session holds that the sample's available memory already
        excludes — by default all it holds (live telemetry of this process's device); pass 0
        when replaying a log recorded without this session."""
        before, after = self.memory.apply_telemetry(sample, in_use_bytes=in_use_bytes)
        if after != before:
            self.follow_budget()
        return after

    def follow_budget(self) -> None:
        """Resize the KV pool to the current budget (between requests), through the swap tier.

        Telemetry may call this from another thread: the resize holds the session's lock, so a
        request never starts on a pool that is half swapped out."""
        if not self._lock.acquire(blocking=False):
            return  # a request is being admitted or served (its admission shrinks the pool itself); the next re-checks
        try:
            self.memory.follow_budget()
        finally:
            self._lock.release()

    # -- serving --------------------------------------------------------------------------

    def generate(self, input_ids: torch.Tensor | None = None, max_new_tokens: int = 20, **inputs: Any) -> torch.Tensor:
        """Same inputs and output as the model's ``generate()`` (token ids, prompt included)."""
        if input_ids is None:
            raise ValueError("GovernedSession.generate needs input_ids (use the processor's output)")
        check_request(input_ids, max_new_tokens)
        # Every row is checked before any is served: a bad row must not cost the others' compute.
        rows = [self._serve(ids, row, max_new_tokens) for ids, row in split_rows(self.model.config, input_ids, inputs)]
        return join_rows(rows, self.model.generation_config.pad_token_id or 0)

    def chat(
        self, input_ids: torch.Tensor, conversation: str = "default", max_new_tokens: int = 20, **inputs: Any
    ) -> torch.Tensor:
        """One turn: ``input_ids`` (and media) of the new message only; returns the reply's ids.

        The session keeps the conversation (earlier messages, replies and media) and sends it
        whole each turn, as a chat loop would — prefix reuse makes that cost only the new part.
        """
        conv = self.conversations.setdefault(conversation, Conversation())
        full, call = conv.turn(input_ids, inputs)
        out = self._serve(full, call, max_new_tokens)
        reply = out[0, full.shape[1] :].tolist()
        conv.reply(reply)
        return torch.tensor([reply], dtype=input_ids.dtype)

    def predict(self, input_ids: torch.Tensor, max_new_tokens: int = 20, **inputs: Any) -> int:
        """Predicted peak bytes of ``generate(input_ids, ...)`` now (cache state included), without running it."""
        return self.admission.predict(self._plan(input_ids, inputs, rung=0), max_new_tokens)

    def admission_step(self, input_ids: torch.Tensor, max_new_tokens: int = 20, **inputs: Any) -> AdmissionAnswer:
        """What admission would answer for ``generate(input_ids, ...)`` now, as a first step; changes nothing."""
        request = Request(input_ids, inputs, max_new_tokens, rung=self.ladder.latency.level)
        with self._lock:
            return self.admission.step(request, self._plan(input_ids, inputs, request.rung))

    def _plan(self, input_ids: torch.Tensor, inputs: dict[str, Any], rung: int) -> RequestPlan:
        """The request at quality ``rung`` (its media pruned or downscaled) and the prefix it reuses."""
        pruned = unpruned = None
        if rung > 0 and media_mod.media_items(self.model.config, input_ids[0].tolist(), inputs):
            call_inputs, pruned = self.ladder.apply(self.ladder.rungs[rung - 1], {"input_ids": input_ids, **inputs})
            if pruned is not None:
                unpruned = (input_ids, input_ids.shape[1] - call_inputs["input_ids"].shape[1])
            input_ids = call_inputs.pop("input_ids")
            inputs = call_inputs
        # a pruned or downscaled image makes other KV than the original: its fingerprints differ, never mix them
        media_tag = f"|{self.ladder.rungs[rung - 1]}" if rung > 0 and pruned is not None else ""
        ids = input_ids[0].tolist()
        bs = self.spec.block_size
        config = self.model.config
        items = media_mod.media_items(config, ids, inputs)
        if media_tag:
            items = [dataclasses.replace(it, fingerprint=it.fingerprint + media_tag) for it in items]
        reuse = 0
        if self.config.prefix_reuse:
            extras = media_mod.block_extras(items, len(ids), bs)  # cached: full blocks, then a turn's partial tail
            cached = self.pool.blocks.cached_prefix_tokens(ids, extras, max_tokens=len(ids) - 1)  # ≥ 1 to prefill
            reuse = media_mod.reuse_boundary(items, cached, bs, config, inputs)
        media_in = media_mod.inputs_after(inputs, items, reuse) if items else {}
        return RequestPlan(
            input_ids=input_ids,
            inputs=inputs,
            items=items,
            reuse_tokens=reuse,
            media_in=media_in,
            pruned=pruned,
            unpruned=unpruned,
        )

    def _serve(self, input_ids: torch.Tensor, inputs: dict[str, Any], max_new_tokens: int) -> torch.Tensor:
        self._check_open()
        serve_start, serve_cpu = time.perf_counter(), time.thread_time()
        self.memory.poll()
        self._wait_while_squeezed()
        self.follow_budget()
        inputs = dict(inputs)
        streamer = FirstTokenStreamer(inputs.pop("streamer", None))
        request = Request(input_ids, inputs, max_new_tokens, rung=self.ladder.latency.level)
        limit_hits = 0
        while True:
            with self._lock:
                try:
                    decision = self._admit(request)  # planning may run the encoder (pruning scores)
                    if decision.kind == "admit":
                        return self._run(request, streamer, serve_start, serve_cpu)
                except (RuntimeError, MemoryError) as exc:
                    if not allocation_failed(exc):
                        raise
                    limit_hits += 1  # raises AdmissionError once retries are spent or tokens went out
                    self.memory.serve_again_after(exc, limit_hits, _LIMIT_RETRIES, streamer.restartable())
                    streamer.restart()
                    request.changes.append("the real memory limit was hit: served again with a larger margin")
                    continue
            if decision.kind != "wait":
                break
            time.sleep(decision.wait_s)  # without the lock: telemetry and other requests go on meanwhile
            self.memory.poll()
        # Rung 4: the fallback session serves it whole, through its own entry point (and its own lock).
        self.log.note("degrade", "served by the fallback model", reason="; ".join(request.changes))
        assert self.fallback is not None  # admission hands over only when there is one
        if streamer.inner is not None:
            inputs["streamer"] = streamer.inner
        return self.fallback.generate(input_ids, max_new_tokens, **inputs)

    def _wait_while_squeezed(self) -> None:
        """A budget lowered below what the session already holds (a squeeze) may come back: wait for it
        before doing anything, since under a squeezed limit even planning could fail to allocate."""
        start = time.perf_counter()
        while self.memory.squeezed:
            if time.perf_counter() - start > self.config.max_wait_s:
                return  # admission decides (shrink, degrade, or refuse with the reason)
            time.sleep(0.01)

    def _admit(self, request: Request) -> AdmissionAnswer:
        """Plan, ask admission, act on its answer, until it admits, hands over to the fallback, or says
        to wait (the caller waits without the lock, then asks again). Raises ``AdmissionError`` with
        admission's reason when it refuses; each change admission asks for makes progress (see
        ``Admission.step``), and past ``max_wait_s`` it refuses, so this ends."""
        while True:
            plan = self._plan(request.input_ids, request.inputs, request.rung)
            decision = self.admission.step(request, plan)
            if decision.kind == "admit":
                assert decision.record is not None
                request.plan, request.decision = plan, decision.record
                record, changes = decision.record, request.changes
                self.log.note(
                    "admit",
                    f"{record.action}: predicted {format_bytes(record.predicted_peak_bytes)} of "
                    f"{format_bytes(record.budget_bytes)}",
                    budget_bytes=record.budget_bytes,
                    predicted_peak_bytes=record.predicted_peak_bytes,
                    changes=list(changes),
                )
                if self.hooks.on_decision is not None:
                    self.hooks.on_decision(record)
                if changes:
                    self.log.note("degrade", "; ".join(changes), rung=request.rung)
                return decision
            if decision.kind == "refuse":
                raise self.admission.refuse(decision)  # recorded (log, stats, metrics), then raised
            if decision.kind == "wait":
                if "waited for the budget" not in request.changes:
                    request.changes.append("waited for the budget")
                return decision
            if decision.change == "fallback":
                request.changes.append(decision.label)
                return decision
            apply_change(decision, request, self.memory)

    def _run(
        self, request: Request, streamer: FirstTokenStreamer, serve_start: float, serve_cpu: float
    ) -> torch.Tensor:
        """Generate an admitted request on its plan; its KV blocks are committed for reuse, then freed."""
        plan, decision = request.plan, request.decision
        assert plan is not None and decision is not None
        input_ids, ids, items, reuse = plan.input_ids, plan.ids, plan.items, plan.reuse_tokens
        bs = self.spec.block_size
        media_keys = {k for m in media_mod.MEDIA_KEYS.values() for k in m}
        passthrough = {k: v for k, v in plan.inputs.items() if k not in media_keys and k != "attention_mask"}
        extras = media_mod.block_extras(items, len(ids), bs)
        seq_id = f"seq-{next(self._ids)}"
        pool = self.pool
        alloc = pool.blocks.allocate(seq_id, ids, extras, register=False, max_hit_tokens=reuse)
        seq = Sequence(pool, seq_id, alloc.block_ids, alloc.num_cached_tokens)
        encoder = self.encoder_cache
        encoder_before = encoder.encoder_s if encoder is not None else 0.0
        if reuse > 0 and media_mod.positions_are_media_dependent(self.model.config):
            # never the model's own rope_deltas on a cached prefix: they are the last request's, not this one's
            if self._mrope is not None and "position_ids" not in passthrough:
                passthrough["position_ids"] = self._mrope.position_ids(input_ids, plan.inputs, items, reuse)
            elif hasattr(inner := getattr(self.model, "model", None), "rope_deltas"):  # reuse stopped before media:
                inner.rope_deltas = None  # type: ignore[union-attr]  # generate() computes them afresh
        try:
            generate_start, generate_cpu = time.perf_counter(), time.thread_time()
            with self.ladder.installed(plan.pruned):
                out = self.model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    **{cache_keyword(self.model): PagedCache(seq)},
                    max_new_tokens=request.max_new_tokens,
                    streamer=streamer,
                    **plan.media_in,
                    **passthrough,
                )
            generate_s, generate_cpu = time.perf_counter() - generate_start, time.thread_time() - generate_cpu
            written = out[0, : seq.length].tolist()
            pool.blocks.commit(seq_id, written, media_mod.block_extras(items, len(written), bs))
        finally:
            pool.blocks.free_sequence(seq_id)
            request.plan = None  # never keep a caller's tensors alive past the request
            self.memory.after_request()
        t0, t1 = request.start_s, time.perf_counter()
        encoder_s = (encoder.encoder_s if encoder is not None else 0.0) - encoder_before
        self.records.append(
            RequestRecord(
                prompt_tokens=len(ids),
                reused_tokens=reuse,
                new_tokens=out.shape[1] - len(ids),
                media_items=len(items),
                media_reencoded=bool(plan.media_in),
                decision=decision,
                prefill_s=(streamer.first_token_at or t1) - t0,
                total_s=t1 - t0,
                rung=request.rung,
                encoder_s=encoder_s,
                overhead_s=t1 - serve_start - generate_s,
                overhead_cpu_s=time.thread_time() - serve_cpu - generate_cpu,
            )
        )
        step = self.ladder.latency.observe(encoder_s, max(0.0, t1 - t0 - encoder_s))
        if step is not None:
            self.log.note("degrade", f"latency level {step.setting}: {step.reason}", rung=step.setting)
        if input_ids is not request.input_ids:  # pruned: the caller's prompt, as generate() returns it
            out = torch.cat([request.input_ids.to(out.device, out.dtype), out[:, input_ids.shape[1] :]], dim=1)
        return out

    # -- reporting ------------------------------------------------------------------------

    def stats(self, include_requests: bool = True) -> dict[str, Any]:
        """What the session holds and has done: budget, pool and cache figures, and counts kept as it
        runs (``requests_served``, ``decisions`` and ``refusals`` by reason, ``event_counts`` by kind,
        the latest request's ``degradation_rung``, ``reused_tokens`` and ``media_reencoded`` (None
        before any), ``reused_tokens_total``, the latest ``telemetry`` reading the budget followed).
        With ``include_requests`` (the default) also the log (``events``) and every request's record
        (``requests``), which grow with every request served; a metrics scrape leaves them out."""
        enc = self.encoder_cache
        counts, num_records, num_events = self.tally.look(self.records, self.events)
        out: dict[str, Any] = {
            "budget_bytes": self.budget_bytes,
            "weights_bytes": self.weights_bytes,
            **self.pool.figures(),
            "prefix_reuse_off_reason": self.prefix_reuse_off_reason,  # None: every cached prefix is reused whole
            "encoder_hits": enc.hits if enc else 0,
            "encoder_misses": enc.misses if enc else 0,
            "meta_predictions": self.predictor.meta_runs,
            "latency_level": self.ladder.latency.level,
            **counts,
        }
        if include_requests:  # the lists end where the counts do
            out["events"] = self.events[:num_events]
            out["requests"] = [r.to_json() for r in self.records[:num_records]]
        return out


__all__ = ["GovernedSession"]
