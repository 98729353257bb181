"""GovernedSession: serve a transformers VLM / audio-LM under a memory budget.

The session owns the memory a plain ``model.generate()`` would grow without limit:

- one paged KV pool (``runtime/kvcache.py``) sized at start within the budget, shared by all
  requests and conversations, with content-hash prefix reuse (``runtime/blocks.py``): a
  conversation's next turn, or another request about the same image, finds its prefix's KV
  in the pool and prefills only what is new — the image is neither re-encoded nor
  re-prefilled;
- an encoder output cache (``runtime/encoders.py``) for the same media after a different
  prefix;
- admission control (``runtime/admission.py``): before a request runs its peak is predicted
  on a meta twin of the model; a request that does not fit waits for the budget to come back
  or is degraded, and the decision is recorded.

Generation itself is the model's own ``generate()`` on the session's cache, so decoding
(logits processors, stopping criteria, greedy) is exactly transformers'. Greedy outputs equal
plain ``model.generate()`` token for token (tests).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from memwarden.runtime import media as media_mod
from memwarden.runtime.admission import AdmissionError, Decision, PeakPredictor
from memwarden.runtime.degrade import Ladder, LadderConfig
from memwarden.runtime.encoders import EncoderCache, LRUStore
from memwarden.runtime.kvcache import KVPool, KVSpec, PagedCache, Sequence
from memwarden.runtime.session_admit import AdmissionMixin
from memwarden.runtime.session_memory import (
    BudgetError,
    MemoryMixin,
    _fix_mmap_threshold,
    _return_freed_memory,
    state_bytes,
)
from memwarden.units import format_bytes, parse_bytes

_PER_TOKEN_KEYS = ("attention_mask", "token_type_ids", "mm_token_type_ids")


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
        }


class _FirstToken:
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


@dataclass
class _Conversation:
    input_ids: list[int] = field(default_factory=list)
    media: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    per_token: dict[str, list[int]] = field(default_factory=dict)


class GovernedSession(AdmissionMixin, MemoryMixin):
    """Serve ``model`` under ``budget`` bytes (``"6GiB"``, an int, or a budget controller).

    ``budget`` may also be any object with a ``budget_bytes`` attribute (a
    ``runtime.budget`` controller following telemetry); it is read before every request.
    ``kv_fraction`` of what the budget leaves after the weights goes to the KV pool (unless
    ``num_kv_blocks`` is given), the rest to activations. On CPU the session fixes glibc's mmap
    threshold at ``heap_mmap_threshold`` bytes (process-wide; ``None`` leaves it alone) so that
    freed activations leave the resident set that a device's memory killer watches.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        processor: Any = None,
        budget: str | int | Any = "6GiB",
        device_profile: Any = None,
        block_size: int = 16,
        *,
        num_kv_blocks: int | None = None,
        kv_fraction: float = 0.5,
        prefix_reuse: bool = True,
        encoder_cache: bool | Any = True,
        encoder_cache_bytes: int = 64 * 1024**2,
        max_wait_s: float = 30.0,
        swap_dir: str | None = None,
        stream: bool | str = "auto",
        offload_dir: str | None = None,
        activation_reserve_bytes: int | None = None,
        min_kv_tokens: int = 1024,
        safety_fraction: float = 0.03,
        quantize: int | None = None,
        group_size: int = 128,
        example_inputs: dict[str, Any] | None = None,
        ladder: LadderConfig | None = None,
        lower_resolution: Callable[[dict[str, Any], float], dict[str, Any]] | None = None,
        fallback: GovernedSession | None = None,
        on_decision: Callable[[Decision], None] | None = None,
        heap_mmap_threshold: int | None = 128 * 1024,
    ) -> None:
        self.model = model
        self.processor = processor
        self.device_profile = device_profile
        self._budget_source = None if isinstance(budget, (str, int)) else budget
        self._fixed_budget = parse_bytes(budget) if isinstance(budget, (str, int)) else None
        self._initial_budget = self._fixed_budget if self._fixed_budget is not None else 2**62
        self._budget_lowered = False
        self.kv_fraction = kv_fraction
        self.safety_fraction = safety_fraction
        self._user_blocks = num_kv_blocks
        self.swap_dir = swap_dir
        self.events: list[dict[str, Any]] = []  # budget changes, pool resizes, degradations: what and why
        self.prefix_reuse = prefix_reuse
        self.max_wait_s = max_wait_s
        self.ladder = Ladder(model, ladder, lower_resolution)
        self.fallback = fallback  # rung 4: a session over a smaller language model the user registered
        self.on_decision = on_decision
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self.records: list[RequestRecord] = []
        self._request_tensors: list[torch.Tensor] = []
        self._media_tag = ""  # added to media fingerprints of a degraded request: its KV differs
        self._unpruned: tuple[torch.Tensor, int] | None = None  # (original ids, tokens pruned) of this request
        self._want_rung = False
        self._use_fallback = False
        self.conversations: dict[str, _Conversation] = {}

        on_cpu = all(p.device.type in ("cpu", "meta") for p in model.parameters())
        if heap_mmap_threshold is not None and on_cpu:
            _fix_mmap_threshold(heap_mmap_threshold)  # freed tensors leave the resident set (see the function)
        if quantize is not None:  # int4 weight-only linears, in place (runtime/quant.py)
            from memwarden.runtime.quant import quantize as quantize_model

            quantize_model(model, bits=quantize, group_size=group_size)
            _return_freed_memory()  # the fp32 weights just freed stay in glibc's heap otherwise (RSS)
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        self.device = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
        self.spec = KVSpec.from_config(model.config, dtype=dtype, block_size=block_size)
        self.predictor = PeakPredictor(model, self.spec)
        self.streamer: Any = None
        self.weights_bytes = state_bytes(model)
        budget_now = self.budget_bytes
        if example_inputs and "input_ids" in example_inputs:  # the pool must hold a request like it
            example_tokens = example_inputs["input_ids"].shape[1] + int(example_inputs.get("max_new_tokens", 32))
            min_kv_tokens = max(min_kv_tokens, example_tokens)
        min_pool = self.spec.page_size_bytes * self.pool_blocks_for_tokens(min_kv_tokens)
        self._min_pool_bytes = min_pool
        self.stream_allowed = stream is not False
        self._offload_dir = offload_dir
        reserve = activation_reserve_bytes if activation_reserve_bytes is not None else budget_now // 10
        if stream is True or (stream == "auto" and self.weights_bytes + min_pool > budget_now * 0.6):
            if activation_reserve_bytes is None:  # room for a request like example_inputs, or a 512-token prefill
                reserve = max(reserve, self._reserve_for(example_inputs))
            if stream is True or self.weights_bytes + min_pool + reserve > budget_now:
                try:
                    self._stream(budget_now, min_pool, reserve, offload_dir)
                except BudgetError:
                    if stream is True:
                        raise  # asked for; "auto" goes on resident and lets admission size the pool
        self.activation_reserve_bytes = reserve
        if num_kv_blocks is None:
            num_kv_blocks = self._pool_blocks_for(budget_now)
        if num_kv_blocks < 1:
            raise BudgetError(
                f"a budget of {format_bytes(budget_now)} does not hold the weights ({format_bytes(self.weights_bytes)}) "
                f"and one KV block ({format_bytes(self.spec.page_size_bytes)}): raise the budget, quantize the "
                "weights (memwarden.quantize) or stream them (runtime.offload)"
            )
        self.pool = KVPool(self.spec, num_kv_blocks, device=self.device)
        self.encoder_cache: EncoderCache | None = None
        if encoder_cache:
            store = encoder_cache if not isinstance(encoder_cache, bool) else LRUStore(encoder_cache_bytes)
            self.encoder_cache = EncoderCache(model, store)

    def close(self) -> None:
        """Restore the model: encoder wrappers removed, streamed weights brought back."""
        if self.encoder_cache is not None:
            self.encoder_cache.remove()
            self.encoder_cache = None
        if self.streamer is not None:
            self.streamer.detach()
            self.streamer = None

    def __enter__(self) -> GovernedSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- serving --------------------------------------------------------------------------

    def generate(self, input_ids: torch.Tensor | None = None, max_new_tokens: int = 20, **inputs: Any) -> torch.Tensor:
        """Same inputs and output as the model's ``generate()`` (token ids, prompt included)."""
        if input_ids is None:
            raise ValueError("GovernedSession.generate needs input_ids (use the processor's output)")
        rows = []
        for r in range(input_ids.shape[0]):
            row_inputs = _row(inputs, r, input_ids.shape)
            mask = row_inputs.get("attention_mask")
            keep = (
                mask[0].bool() if isinstance(mask, torch.Tensor) else torch.ones(input_ids.shape[1], dtype=torch.bool)
            )
            row_inputs = {k: (v[:, keep] if k in _PER_TOKEN_KEYS and isinstance(v, torch.Tensor) else v)
                          for k, v in row_inputs.items()}  # fmt: skip
            rows.append(self._serve(input_ids[r : r + 1, keep], row_inputs, max_new_tokens))
        if len(rows) == 1:
            return rows[0]
        width = max(r.shape[1] for r in rows)
        pad = self.model.generation_config.pad_token_id or 0
        return torch.cat([torch.nn.functional.pad(r, (width - r.shape[1], 0), value=pad) for r in rows])

    def chat(self, input_ids: torch.Tensor, conversation: str = "default", max_new_tokens: int = 20,
             **inputs: Any) -> torch.Tensor:  # fmt: skip
        """One turn: ``input_ids`` (and media) of the new message only; returns the reply's ids.

        The session keeps the conversation (earlier messages, replies and media) and sends it
        whole each turn, as a chat loop would — prefix reuse makes that cost only the new part.
        """
        conv = self.conversations.setdefault(conversation, _Conversation())
        for key, value in inputs.items():
            if isinstance(value, torch.Tensor) and key not in _PER_TOKEN_KEYS:
                conv.media.setdefault(key, []).append(value)
        turn_ids = input_ids[0].tolist()
        for key in _PER_TOKEN_KEYS[1:]:
            if isinstance(inputs.get(key), torch.Tensor):
                conv.per_token.setdefault(key, [0] * len(conv.input_ids)).extend(inputs[key][0].tolist())
        conv.input_ids.extend(turn_ids)
        full = torch.tensor([conv.input_ids], dtype=input_ids.dtype)
        call: dict[str, Any] = {k: torch.cat(v) for k, v in conv.media.items()}
        call.update({k: torch.tensor([v], dtype=torch.long) for k, v in conv.per_token.items()})
        out = self._serve(full, call, max_new_tokens)
        reply = out[0, full.shape[1] :].tolist()
        conv.input_ids.extend(reply)
        for key in conv.per_token:
            conv.per_token[key].extend([0] * len(reply))
        return torch.tensor([reply], dtype=input_ids.dtype)

    def predict(self, input_ids: torch.Tensor, max_new_tokens: int = 20, **inputs: Any) -> int:
        """Predicted peak bytes of ``generate(input_ids, ...)`` now (cache state included), without running it."""
        ids = input_ids[0].tolist()
        items, reuse, media_in = self._plan_reuse(ids, inputs)
        self._request_tensors = [input_ids] + [v for v in inputs.values() if isinstance(v, torch.Tensor)]
        try:
            return self._predict(input_ids[:, reuse:], media_in, reuse, max_new_tokens)
        finally:
            self._request_tensors = []  # never keep a caller's tensors alive

    def _plan_reuse(self, ids: list[int], inputs: dict[str, Any]) -> tuple[list[Any], int, dict[str, Any]]:
        """(media items, reused prefix tokens, media tensors the model must still see)."""
        bs = self.spec.block_size
        config = self.model.config
        items = media_mod.media_items(config, ids, inputs)
        if self._media_tag:  # a pruned or downscaled image makes other KV than the original: never mix them
            items = [dataclasses.replace(it, fingerprint=it.fingerprint + self._media_tag) for it in items]
        reuse = 0
        if self.prefix_reuse:
            hit_blocks = self.pool.blocks.cached_prefix_blocks(ids, media_mod.block_extras(items, len(ids), bs))
            hit_blocks = min(hit_blocks, (len(ids) - 1) // bs)  # at least one token is prefilled
            reuse = media_mod.reuse_boundary(items, hit_blocks * bs, bs, config, inputs)
        media_in = media_mod.inputs_after(inputs, items, reuse) if items else {}
        return items, reuse, media_in

    def _serve(self, input_ids: torch.Tensor, inputs: dict[str, Any], max_new_tokens: int) -> torch.Tensor:
        poll = getattr(self._budget_source, "poll", None)
        if callable(poll):
            poll()
        self._wait_while_squeezed()
        self.follow_budget()
        with self._lock:
            return self._serve_locked(input_ids, inputs, max_new_tokens)

    def _wait_while_squeezed(self) -> None:
        """A budget lowered below what the session already holds (a squeeze) may come back: wait for it
        before doing anything, since under a squeezed limit even planning could fail to allocate."""
        start = time.perf_counter()
        while self._budget_lowered and self.held_bytes > self.budget_bytes:
            if time.perf_counter() - start > self.max_wait_s:
                return  # admission decides (shrink, degrade, or refuse with the reason)
            time.sleep(0.01)

    def _serve_locked(self, input_ids: torch.Tensor, inputs: dict[str, Any], max_new_tokens: int) -> torch.Tensor:
        t0 = time.perf_counter()
        inputs = dict(inputs)
        streamer = _FirstToken(inputs.pop("streamer", None))
        original = (input_ids, inputs)
        changes: list[str] = []
        start = time.perf_counter()
        rung = self.ladder.latency.level  # a latency level persists across requests; memory rungs are per request
        pruned = None
        while True:  # admission: each pass either admits or makes one change and plans again
            input_ids, inputs = original
            pruned = None
            self._unpruned = None
            if rung > 0 and self._has_media(input_ids, inputs):
                step = self.ladder.rungs[rung - 1]
                call_inputs, pruned = self.ladder.apply(step, {"input_ids": input_ids, **inputs})
                if pruned is not None:
                    self._unpruned = (input_ids, input_ids.shape[1] - call_inputs["input_ids"].shape[1])
                input_ids = call_inputs.pop("input_ids")
                inputs = call_inputs
            self._media_tag = f"|{self.ladder.rungs[rung - 1]}" if rung > 0 and pruned is not None else ""
            ids = input_ids[0].tolist()
            self._request_tensors = [input_ids] + [v for v in inputs.values() if isinstance(v, torch.Tensor)]
            items, reuse, media_in = self._plan_reuse(ids, inputs)
            self._want_rung = False
            decision = self._admit(input_ids[:, reuse:], media_in, reuse, max_new_tokens, changes, start)
            if decision is not None:
                break
            if self._want_rung:
                rung += 1
                changes.append(f"{self.ladder.rungs[rung - 1][0]} {self.ladder.rungs[rung - 1][1]}")
            if self._use_fallback:
                self._use_fallback = False
                self._request_tensors = []
                self._note("degrade", "served by the fallback model", reason="; ".join(changes))
                return self.fallback._serve_locked(original[0], {**original[1], "streamer": streamer.inner},
                                                   max_new_tokens)  # fmt: skip
        if changes:
            self._note("degrade", "; ".join(changes), rung=rung)
        bs = self.spec.block_size
        media_keys = {k for m in media_mod.MEDIA_KEYS.values() for k in m}
        passthrough = {k: v for k, v in inputs.items() if k not in media_keys and k != "attention_mask"}
        extras = media_mod.block_extras(items, len(ids), bs)
        seq_id = f"seq-{next(self._ids)}"
        alloc = self.pool.blocks.allocate(seq_id, ids, extras, register=False, max_hit_blocks=reuse // bs)
        seq = Sequence(self.pool, seq_id, alloc.block_ids, alloc.num_cached_tokens)
        encoder_before = self.encoder_cache.encoder_s if self.encoder_cache is not None else 0.0
        try:
            with self.ladder.installed(pruned):
                out = self.model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    cache=PagedCache(seq),
                    max_new_tokens=max_new_tokens,
                    streamer=streamer,
                    **media_in,
                    **passthrough,
                )
            written = out[0, : seq.length].tolist()
            self.pool.blocks.commit(seq_id, written, media_mod.block_extras(items, len(written), bs))
        finally:
            self.pool.blocks.free_sequence(seq_id)
            self._request_tensors = []
            self._media_tag = ""
        t1 = time.perf_counter()
        encoder_s = (self.encoder_cache.encoder_s if self.encoder_cache is not None else 0.0) - encoder_before
        self.records.append(RequestRecord(
            prompt_tokens=len(ids), reused_tokens=reuse, new_tokens=out.shape[1] - len(ids), media_items=len(items),
            media_reencoded=bool(media_in), decision=decision,
            prefill_s=(streamer.first_token_at or t1) - t0, total_s=t1 - t0, rung=rung,
            encoder_s=encoder_s,
        ))  # fmt: skip
        step = self.ladder.latency.observe(encoder_s, max(0.0, t1 - t0 - encoder_s))
        if step is not None:
            self._note("degrade", f"latency level {step.setting}: {step.reason}", rung=step.setting)
        return out

    def _has_media(self, input_ids: torch.Tensor, inputs: dict[str, Any]) -> bool:
        return bool(media_mod.media_items(self.model.config, input_ids[0].tolist(), inputs))

    # -- reporting ------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        blocks = self.pool.blocks
        enc = self.encoder_cache
        return {
            "budget_bytes": self.budget_bytes,
            "weights_bytes": self.weights_bytes,
            "kv_pool_bytes": self.pool.nbytes,
            "kv_blocks": self.pool.num_blocks,
            "kv_free_blocks": blocks.num_free_blocks,
            "kv_cached_blocks": len(blocks.cached),
            "block_size": self.spec.block_size,
            "prefix_hits": blocks.hits,
            "prefix_misses": blocks.misses,
            "evictions": blocks.evictions,
            "encoder_hits": enc.hits if enc else 0,
            "encoder_misses": enc.misses if enc else 0,
            "meta_predictions": self.predictor.meta_runs,
            "latency_level": self.ladder.latency.level,
            "events": list(self.events),
            "requests": [r.to_json() for r in self.records],
        }


def _row(inputs: dict[str, Any], r: int, ids_shape: torch.Size) -> dict[str, Any]:
    """Row ``r`` of a batch: per-token tensors sliced; media left whole when there is one row."""
    if ids_shape[0] == 1:
        return dict(inputs)
    out: dict[str, Any] = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == ids_shape[0]:
            out[k] = v[r : r + 1]
        else:
            out[k] = v
    return out


__all__ = ["AdmissionError", "BudgetError", "GovernedSession", "RequestRecord", "state_bytes"]
