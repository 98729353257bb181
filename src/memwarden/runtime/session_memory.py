"""The memory side of a GovernedSession: its budget, what it holds, and how it makes room.

:class:`SessionMemory` is an object the session holds and asks: the budget in force (fixed,
squeezed, or following telemetry), the bytes the session holds (weights, the KV pool, cached
encoder outputs), the KV pool's size under a budget and its resizes through the swap file, and
weight streaming when the weights do not fit. Every change it makes goes to the session's log.
Callers that change the pool hold the session's lock (the memory has none of its own: one lock
orders serving and resizing).
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any

import torch

from memwarden.govern.budget_value import Budget
from memwarden.runtime import media as media_mod
from memwarden.runtime.admission import AdmissionError, PeakPredictor
from memwarden.runtime.cuda_reserve import ReserveCap
from memwarden.runtime.encoders import EncoderCache
from memwarden.runtime.featcache_contract import default_encoder_store
from memwarden.runtime.host_memory import (
    allocation_failed,
    first_line,
    limit_cap,
    runtime_room,
    state_bytes,
    trim_soon,
)
from memwarden.runtime.kvcache import KVPool, KVSpec
from memwarden.runtime.memory_plan import plan_memory
from memwarden.runtime.session_config import SessionConfig
from memwarden.runtime.session_log import EventLog
from memwarden.runtime.session_offload import open_streamer
from memwarden.runtime.session_owned import BudgetError, Owned
from memwarden.units import format_bytes

if TYPE_CHECKING:
    from memwarden.runtime.offload import WeightStreamer
    from memwarden.runtime.offload_cuda import CudaWeightStreamer

_MIN_SAFETY_BYTES = 256 * 1024  # per-thread kernel workspaces seen on CPU (SDPA) are this order
_LIMIT_STEP_BYTES = 8 * 2**20  # the least the margin grows by when a real limit refuses an allocation
_POOL_SEQUENCES = 4  # default pool cap: this many sequences of the model's full context


class SessionMemory:
    """Budget, held bytes, KV-pool sizing and weight streaming of one GovernedSession.

    Built with the session: it counts the weights, streams them when they do not fit beside the
    smallest pool and the activation reserve, and sizes the KV pool; ``BudgetError`` when the
    budget cannot hold even that."""

    def __init__(
        self,
        model: torch.nn.Module,
        spec: KVSpec,
        predictor: PeakPredictor,
        config: SessionConfig,
        log: EventLog,
        *,
        device: torch.device,
        budget: Budget,
        example_inputs: dict[str, Any] | None = None,
        encoder_store: Any = None,
        processor: Any = None,
    ) -> None:
        self.model = model
        self.spec = spec
        self.predictor = predictor
        self.config = config
        self.log = log
        self.budget = budget  # fixed bytes and/or a source read each time (govern/budget_value.py)
        self.limit_bytes: int | None = None  # what the process may really allocate: set below, once weights are counted
        self.learned_margin_bytes = 0  # kept free beyond the safety fraction under a real limit (limit_hit)
        self.initial_budget = budget.bytes_now()  # what a temporary squeeze (set_budget) returns to
        self.budget_lowered = False  # a temporary squeeze (set_budget(..., temporary=True)) is in force
        self._owned = Owned()
        # Released on close(), or when the session is collected without it; folders also at exit (below).
        self._release = weakref.finalize(self, self._owned.release)
        self._release.atexit = False  # at exit only the folders go (their own finalizers): no weights restored
        self.device = device
        self.weights_bytes = state_bytes(model)
        warmed, self.runtime_bytes = runtime_room(device, spec.dtype)  # host_memory: cuBLAS, segment room
        if warmed:
            log.note(
                "budget",
                f"CUDA runtime: {format_bytes(warmed)} of cuBLAS workspaces, outside the budget",
                runtime_bytes=warmed,
            )
        self._cap_by_limit(device)
        self.stream_allowed = config.stream is not False
        self.activation_reserve_bytes = 0  # set by _place, once the weights are placed
        budget_now = self.budget_bytes
        self._place(budget_now, example_inputs)
        self.pool = self._new_pool(self._pool_size(budget_now), device, budget_now)
        if config.encoder_cache:
            store = (
                encoder_store
                if encoder_store is not None
                else default_encoder_store(model, processor, config.encoder_cache_bytes)
            )
            self._owned.encoder_cache = EncoderCache(model, store)
        if device.type == "cuda" and config.cuda_reserve_cap:  # the reserve, not only the tensors, under the budget
            self._owned.reserve_cap = ReserveCap(device)
            self.cap_reserve()

    # -- the phases of building: the limit read, the weights placed, the pool sized

    def _cap_by_limit(self, device: torch.device) -> None:
        """A budget above what the process may really allocate (its cgroup, RLIMIT_AS) would let
        native code abort or the OOM killer strike mid-request: the session plans for the smaller
        figure."""
        asked = self.budget_bytes
        self.limit_bytes, limit_kind = limit_cap(self.weights_bytes, device)
        if self.limit_bytes is None or self.limit_bytes >= asked:
            return
        self.log.note(
            "budget",
            f"budget capped at {format_bytes(self.limit_bytes)} by this process's {limit_kind}",
            budget_bytes=self.limit_bytes,
        )
        if device.type == "cpu":
            # Under a real limit on the host, what native code holds beside the tensors counts too
            # (kernel scratch and JIT code, thread arenas, the heap's waste: ~25 MiB on the demo's
            # first request, more than its activations): plan with that margin from the start
            # rather than learn it from a failed request (limit_hit).
            self.learned_margin_bytes = max(self.limit_bytes // 10, 2 * _LIMIT_STEP_BYTES)

    def _place(self, budget_now: int, example_inputs: dict[str, Any] | None) -> None:
        """The weights resident or streamed, and the activation reserve. The weights are streamed
        only for the requests the session is asked to serve: a request like ``example_inputs`` (its
        KV and activations) now, each later request at admission (which streams then if that one
        needs it) -- never for a worst case the session may never see, so a roomy budget keeps the
        weights resident."""
        config = self.config
        example_tokens = 0
        if example_inputs and "input_ids" in example_inputs:  # the pool must hold a request like it
            example_tokens = example_inputs["input_ids"].shape[1] + int(example_inputs.get("max_new_tokens", 32))
        plan = plan_memory(
            budget_bytes=budget_now,
            weights_bytes=self.weights_bytes,
            page_size_bytes=self.spec.page_size_bytes,
            block_size=self.spec.block_size,
            min_kv_tokens=config.min_kv_tokens,
            example_tokens=example_tokens,
            reserve_bytes=config.activation_reserve_bytes,
            example_reserve=lambda: self.reserve_for(example_inputs),
            learned_margin_bytes=self.learned_margin_bytes,
            stream=config.stream,
        )
        self.min_pool_bytes = plan.min_pool_bytes
        if plan.stream:
            try:
                self._stream(budget_now, plan.min_pool_bytes, plan.reserve_bytes)
            except BudgetError:
                if config.stream is True:
                    raise  # asked for; "auto" goes on resident and lets admission size the pool
        self.activation_reserve_bytes = plan.reserve_bytes

    def _pool_size(self, budget_now: int) -> int:
        """The KV pool's blocks: the config's, else what the budget holds beside the rest;
        ``BudgetError`` when not even one block fits."""
        num_kv_blocks = self.config.num_kv_blocks
        if num_kv_blocks is None:
            num_kv_blocks = self.pool_blocks_for(budget_now)
        if num_kv_blocks < 1:
            raise BudgetError(
                f"a budget of {format_bytes(budget_now)} does not hold the weights ({format_bytes(self.weights_bytes)}) "
                f"and one KV block ({format_bytes(self.spec.page_size_bytes)}): raise the budget, quantize the "
                "weights (memwarden.quantize) or stream them (runtime.offload)"
            )
        return num_kv_blocks

    def close(self) -> None:
        """Restore the model (encoder wrappers removed, streamed weights brought back) and remove the
        session's temporary folders. Idempotent."""
        self._release()

    @property
    def streamer(self) -> WeightStreamer | CudaWeightStreamer | None:  # asked only what a Streamer answers
        return self._owned.streamer

    @property
    def encoder_cache(self) -> EncoderCache | None:
        return self._owned.encoder_cache

    def _new_pool(self, blocks: int, device: torch.device | str, budget: int) -> KVPool:
        """A KV pool, or ``BudgetError`` where the allocator refuses it (a real limit below the budget)."""
        try:
            return KVPool(self.spec, blocks, device=device)
        except (RuntimeError, MemoryError) as exc:
            if not allocation_failed(exc):
                raise
            raise BudgetError(
                f"a KV pool of {blocks} blocks ({format_bytes(blocks * self.spec.page_size_bytes)}) could not be "
                f"allocated under a budget of {format_bytes(budget)}: the process's real memory limit is lower "
                f"({first_line(exc, 120)}); lower the budget or num_kv_blocks"
            ) from None

    # -- what the session holds -----------------------------------------------------------

    @property
    def budget_bytes(self) -> int:
        """The bytes in force: the budget (fixed, its source's reading) capped by the real limit."""
        return self.budget.bytes_now(self.limit_bytes)

    @property
    def budget_may_rise(self) -> bool:
        """A budget source may raise the budget, and so may the end of a temporary squeeze."""
        return self.budget.source is not None or self.budget_lowered

    @property
    def squeezed(self) -> bool:
        """A temporary squeeze holds the budget below what the session already holds."""
        return self.budget_lowered and self.held_bytes > self.budget_bytes

    @property
    def encoder_outputs_bytes(self) -> int:
        store = self.encoder_cache.store if self.encoder_cache is not None else None
        return int(getattr(store, "nbytes", 0) or 0)

    @property
    def held_bytes(self) -> int:
        """Bytes the session holds between requests: weights, the KV pool, cached encoder outputs."""
        return self.weights_bytes + self.pool.nbytes + self.encoder_outputs_bytes

    @property
    def working_set_bytes(self) -> int:
        """The least the session serves with: its weights, the smallest KV pool and the activation reserve."""
        return self.weights_bytes + self.min_pool_bytes + max(0, self.activation_reserve_bytes)

    def admissible(self, budget: int) -> int:
        """The most a request may be predicted to use: the budget less the safety margin (kernel
        workspaces, per-thread buffers and the session's bookkeeping are not in the prediction)."""
        margin = max(int(budget * self.config.safety_fraction), _MIN_SAFETY_BYTES) + self.learned_margin_bytes
        return budget - margin - self.runtime_bytes

    def serve_again_after(self, exc: BaseException, hits: int, retries: int, restartable: bool) -> None:
        """The process's real limit refused an allocation the plan counted on (``hits`` times for this
        request): what runs beside the tensors (kernel scratch, JIT code, the heap's own waste) took
        more than the margin. Learn a larger margin so that the request is served again under it
        (admission shrinks the pool or streams weights); raise :class:`AdmissionError` with the
        reason once ``retries`` are spent, or where tokens already went out (never sent twice)."""
        what = first_line(exc)
        if hits > retries or not restartable:
            why = (
                f"the process's real memory limit refused an allocation {hits} times, the last with a "
                f"margin of {format_bytes(self.learned_margin_bytes)} kept free"
                if restartable
                else "the process's real memory limit refused an allocation after tokens "
                "had been streamed (a request is never sent twice)"
            )
            self.log.note("refuse", why)
            raise AdmissionError(
                f"{why} ({what}): raise the process's memory limit, or shrink what it serves: "
                "quantize the weights (memwarden.quantize)"
            ) from exc
        self.limit_hit(what)

    def limit_hit(self, what: str) -> None:
        """An allocation the plan counted on was refused by the process's real limit: keep a larger
        margin from now on (a step of a tenth of the budget, at least 8 MiB), cached encoder outputs
        dropped. What native code holds beside the tensors is not in any prediction; this learns it."""
        budget = self.budget_bytes
        self.learned_margin_bytes += max(budget // 10, _LIMIT_STEP_BYTES)
        self.drop_encoder_outputs()
        self.log.note(
            "limit",
            f"the real memory limit refused an allocation ({what}): margin now "
            f"{format_bytes(self.learned_margin_bytes)} beyond the safety fraction",
            budget_bytes=budget,
            learned_margin_bytes=self.learned_margin_bytes,
        )

    def pool_blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.spec.block_size)

    def pool_blocks_for(self, budget_bytes: int) -> int:
        """Default pool size under a budget: ``kv_fraction`` of what the weights leave, capped at a
        few sequences of the model's full context (more is memory no request can use)."""
        spare = budget_bytes - self.weights_bytes - self.runtime_bytes - self.learned_margin_bytes
        # With streamed weights the placement kept exactly the activation reserve free: never give it to KV.
        reserve = self.activation_reserve_bytes if self.streamer is not None else 0
        blocks = self.spec.blocks_for_bytes(int(min(spare * self.config.kv_fraction, spare - reserve)))
        model_config: Any = self.model.config  # a transformers config (nn.Module types attributes as Tensor | Module)
        text = model_config.get_text_config(decoder=True)
        max_tokens = _POOL_SEQUENCES * int(getattr(text, "max_position_embeddings", 0) or 4096)
        return min(blocks, self.pool_blocks_for_tokens(max_tokens))

    def reserve_for(self, example: dict[str, Any] | None) -> int:
        """Activation bytes to keep free: a request like ``example`` (prefill and decode, its tensors
        included), else a 512-token text prefill."""
        if not example or "input_ids" not in example:
            return self.predictor.prefill_bytes(torch.zeros((1, 512), dtype=torch.long), {}, 0)
        ids = example["input_ids"][:1]
        items = media_mod.media_items(self.model.config, ids[0].tolist(), example)
        media = media_mod.inputs_after(example, items, 0) if items else {}
        tensors = sum(t.numel() * t.element_size() for t in example.values() if isinstance(t, torch.Tensor))
        return tensors + self.predictor.request_bytes(ids, media, 0, int(example.get("max_new_tokens", 32)))

    # -- making room (the caller holds the session's lock) --------------------------------

    def drop_encoder_outputs(self) -> None:
        if self.encoder_cache is not None:
            self.encoder_cache.store.clear()

    def resize_pool(self, blocks: int, budget: int, why: str) -> None:
        """Resize the KV pool through the swap tier: cached blocks that no longer fit go to disk."""
        import tempfile

        have = self.pool.num_blocks
        try:
            self.pool = self.pool.resized(blocks, self.config.swap_dir or tempfile.gettempdir())
        except (RuntimeError, MemoryError) as exc:  # the old pool is kept (resized() rebuilds it)
            if not allocation_failed(exc):
                raise
            raise BudgetError(
                f"the KV pool could not be resized to {blocks} blocks: the process's real memory "
                f"limit is lower than the budget {format_bytes(budget)}"
            ) from None
        self.log.note(
            "kv-pool",
            f"KV pool {have} -> {blocks} blocks ({format_bytes(self.pool.nbytes)}): {why}",
            budget_bytes=budget,
            blocks=blocks,
            kept_cached_blocks=len(self.pool.blocks.cached),
        )

    def restream(self, budget: int) -> bool:
        """Stream (more of) the weights now, for the current pool and activation reserve; whether that
        freed anything. A running streamer streams more where it can (the streamed groups stay where
        they are; a GPU streamer plans once)."""
        from memwarden.plan.placement import PlacementError

        before = self.weights_bytes
        streamer = self.streamer
        if streamer is None:
            try:
                self._stream(budget, self.pool.nbytes, self.activation_reserve_bytes)
            except (BudgetError, PlacementError):
                self._stream(budget, self.pool.nbytes, 0)  # the most that can be streamed
        elif streamer.stream_more_within(
            max(1, self.admissible(budget)),
            kv_cache_bytes=self.pool.nbytes,
            activation_bytes=self.activation_reserve_bytes,
        ):
            self.weights_bytes = state_bytes(self.model) + streamer.staging_bytes
            self.log.note(
                "stream",
                f"more weights streamed: {format_bytes(self.weights_bytes)} resident",
                budget_bytes=budget,
                resident_bytes=self.weights_bytes,
            )
        return self.weights_bytes < before

    def _stream(self, budget: int, kv_bytes: int, reserve: int) -> None:
        """Weights that do not fit stay in safetensors files, memory-mapped, and stream through two
        staging slots (``runtime/offload.py``); what the session holds is recounted after."""
        planned = self.admissible(budget)  # admission keeps this margin free too
        streamer, directory = open_streamer(
            self.model,
            self._owned,
            budget,
            planned,
            self.device,
            self.config.offload_dir,
            kv_bytes=kv_bytes,
            reserve=reserve,
            weights_bytes=self.weights_bytes,
        )
        self._owned.streamer = streamer
        self.weights_bytes = state_bytes(self.model) + streamer.staging_bytes
        self.log.note(
            "stream",
            f"weights streamed from {directory}: {format_bytes(self.weights_bytes)} resident",
            budget_bytes=budget,
            resident_bytes=self.weights_bytes,
        )

    # -- following the budget -------------------------------------------------------------

    def poll(self) -> None:
        """Let a budget source that samples on demand take a fresh reading; on a GPU, read the device's
        free memory again (another process may have taken or returned some)."""
        if self.device.type == "cuda":
            self.limit_bytes, _ = limit_cap(self.held_bytes, self.device)
        poll = getattr(self.budget.source, "poll", None)
        if callable(poll):
            poll()
        self.cap_reserve()  # at the budget this reading gives

    def cap_reserve(self) -> None:
        """On a GPU, cap what the caching allocator may reserve at what the process holds outside the
        session plus the budget (``runtime/cuda_reserve.py``): its cache of freed blocks is given back
        before the device loses more than the budget to the session."""
        cap = self._owned.reserve_cap
        if cap is not None:
            before = cap.limit_bytes
            if abs(cap.apply(self.budget_bytes, self.held_bytes) - before) > 2**21:  # not each request's inputs
                self.log.note(
                    "budget",
                    f"the device's reserve capped at {format_bytes(cap.limit_bytes)} (set_per_process_memory_fraction)",
                    reserve_cap_bytes=cap.limit_bytes,
                )

    def after_request(self) -> None:
        """On the host, the heap's freed pages (a memory killer counts them) back to the OS, soon."""
        if self.device.type == "cpu" and self.config.heap_mmap_threshold is not None:
            trim_soon()

    def set_budget(self, budget: str | int, *, temporary: bool = False) -> bool:
        """A new fixed budget; returns whether the pool should follow it now (not under a squeeze,
        where allocating a new pool could itself fail: requests wait it out instead)."""
        self.budget = self.budget.with_fixed(budget)
        fixed = int(self.budget.fixed_bytes or 0)
        self.budget_lowered = temporary and fixed < self.initial_budget
        self.log.note("budget", f"budget set to {format_bytes(fixed)}", budget_bytes=fixed)
        return not self.budget_lowered

    def apply_telemetry(self, sample: Any, *, in_use_bytes: int | None = None) -> tuple[int, int]:
        """Feed one telemetry sample to the budget controller (created on first use, capped at the
        fixed budget); returns the budget before and after it."""
        from memwarden.govern.budget import BudgetController
        from memwarden.govern.telemetry import TelemetrySample

        if not isinstance(sample, TelemetrySample):  # a foreign sample: map the usual field names
            sample = TelemetrySample(
                t_s=float(getattr(sample, "t_s", getattr(sample, "time_s", time.monotonic()))),
                mem_total_bytes=getattr(sample, "mem_total_bytes", None),
                mem_available_bytes=getattr(sample, "mem_available_bytes", None),
                temp_c=getattr(sample, "temp_c", getattr(sample, "temperature_c", None)),
                power_w=getattr(sample, "power_w", None),
                fps=getattr(sample, "fps", None),
            )
        source = self.budget.source
        if source is None or not hasattr(source, "update"):
            source = BudgetController(cap_bytes=self.budget.fixed_bytes)
            # heat / power / fps never push the budget below what serving needs at all
            source.floor_bytes = self.working_set_bytes
            self.budget = self.budget.with_source(source)
        before = self.budget_bytes
        source.update(sample, in_use_bytes=self.held_bytes if in_use_bytes is None else in_use_bytes)
        after = self.budget_bytes
        if after != before:
            self.log.note(
                "budget",
                f"telemetry: budget {format_bytes(before)} -> {format_bytes(after)}",
                budget_bytes=after,
                temp_c=sample.temp_c,
                power_w=sample.power_w,
                fps=sample.fps,
            )
        return before, after

    def follow_budget(self) -> None:
        """Resize the KV pool to the current budget, between requests (the caller holds the lock)."""
        budget = self.budget_bytes
        user_blocks = self.config.num_kv_blocks
        want = self.pool_blocks_for(budget) if user_blocks is None else user_blocks
        have = self.pool.num_blocks
        over = self.held_bytes > budget
        if user_blocks is not None and not over:
            return
        if over:  # shrink until what the session holds fits, keeping room for activations
            want = min(want, self.pool_blocks_for(budget))
        if want < 1:
            self.log.note(
                "degrade",
                "budget below the weights plus one KV block: nothing left to shrink",
                budget_bytes=budget,
                weights_bytes=self.weights_bytes,
            )
            return
        if want == have or (not over and abs(want - have) < max(1, have // 10)):
            return  # within 10%: not worth a resize
        if self.encoder_cache is not None and over:
            self.encoder_cache.store.clear()
        try:
            self.resize_pool(want, budget, "follow the budget")
        except BudgetError:
            if want < have:
                raise
            # A larger pool is only room to spare: where the process's real limit refuses it, keep the
            # pool there is (resized() left it in place) and a larger margin from now on.
            self.limit_hit(f"a KV pool of {want} blocks")


__all__ = ["SessionMemory"]
