"""The memory side of a GovernedSession: its budget, what it holds, and how it makes room.

A mixin of :class:`~memwarden.runtime.session.GovernedSession` (kept apart so that each module
holds one idea): the budget in force (fixed, squeezed, or following telemetry), the bytes the
session holds, the KV pool's size under a budget and its resizes through the swap file, weight
streaming when the weights do not fit, and the decision log every change goes to.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch

from memwarden.runtime import media as media_mod
from memwarden.units import format_bytes, parse_bytes

_MIN_SAFETY_BYTES = 256 * 1024  # per-thread kernel workspaces seen on CPU (SDPA) are this order
_POOL_SEQUENCES = 4  # default pool cap: this many sequences of the model's full context


class BudgetError(ValueError):
    """The budget cannot hold the model at all (weights plus the smallest KV pool)."""


def state_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers in memory (shared storages once, meta excluded)."""
    seen: set[int] = set()
    total = 0
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.device.type == "meta":
            continue
        st = t.untyped_storage()
        if st.data_ptr() in seen:
            continue
        seen.add(st.data_ptr())
        total += st.nbytes()
    return total


def _libc() -> Any:
    """The C library through ctypes, or None where there is none to load."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _return_freed_memory() -> None:
    """Ask glibc to give freed heap pages back to the OS, so that resident memory (what a phone's
    memory killer watches) reflects what the session holds. A no-op elsewhere."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


_M_MMAP_THRESHOLD = -3  # mallopt parameter (malloc.h)


def _fix_mmap_threshold(threshold_bytes: int) -> bool:
    """Fix glibc's mmap threshold: blocks at least this large are mapped and unmapped on their own.

    glibc raises the threshold (up to 32 MiB) each time a large mapped block is freed, after which
    tensors of that size come from the heap and their pages stay resident when freed; a fixed
    threshold disables that adjustment (``MALLOC_MMAP_THRESHOLD_`` does the same from the
    environment). Measured on the demo deployment: ~15 MiB less resident, same latency.
    Process-wide; returns whether it was applied (glibc only)."""
    libc = _libc()
    return bool(libc is not None and hasattr(libc, "mallopt") and libc.mallopt(_M_MMAP_THRESHOLD, threshold_bytes))


class MemoryMixin:
    """Budget, held bytes, KV-pool sizing and weight streaming of a GovernedSession."""

    # Set by GovernedSession.__init__.
    model: Any
    spec: Any
    pool: Any
    predictor: Any
    streamer: Any
    encoder_cache: Any
    events: list[dict[str, Any]]

    def _reserve_for(self, example: dict[str, Any] | None) -> int:
        """Activation bytes to keep free: a request like ``example`` (prefill and decode, its tensors
        included), else a 512-token text prefill."""
        if not example or "input_ids" not in example:
            return self.predictor.prefill_bytes(torch.zeros((1, 512), dtype=torch.long), {}, 0)
        ids = example["input_ids"][:1]
        items = media_mod.media_items(self.model.config, ids[0].tolist(), example)
        media = media_mod.inputs_after(example, items, 0) if items else {}
        tensors = sum(t.numel() * t.element_size() for t in example.values() if isinstance(t, torch.Tensor))
        return tensors + self.predictor.request_bytes(ids, media, 0, int(example.get("max_new_tokens", 32)))

    def _restream(self, budget: int) -> bool:
        """Stream the weights now, for the current pool and activation reserve. Only from resident
        weights: re-planning a running streamer would bring every weight back first."""
        from memwarden.plan.placement import PlacementError

        if self.streamer is not None:
            return False
        before = self.weights_bytes
        try:
            self._stream(budget, self.pool.nbytes, self.activation_reserve_bytes, self._offload_dir)
        except (BudgetError, PlacementError):
            self._stream(budget, self.pool.nbytes, 0, self._offload_dir)  # the most that can be streamed
        return self.weights_bytes < before

    def _stream(self, budget: int, kv_bytes: int, reserve: int, offload_dir: str | None) -> None:
        """Weights that do not fit stay in safetensors files, memory-mapped, and stream through two
        staging slots (``runtime/offload.py``); what the session holds is recounted after."""
        import tempfile

        from memwarden.plan.placement import PlacementError
        from memwarden.runtime.offload import stream_weights

        directory = offload_dir or tempfile.mkdtemp(prefix="memwarden-offload-")
        try:
            planned = self._admissible(budget)  # admission keeps this margin free too
            if planned <= 0:
                raise PlacementError(
                    f"{format_bytes(budget)} is less than the safety margin", min_budget_bytes=budget * 2
                )
            self.streamer = stream_weights(self.model, planned, directory, kv_cache_bytes=kv_bytes,
                                           activation_bytes=reserve)  # fmt: skip
        except PlacementError as exc:
            raise BudgetError(
                f"a budget of {format_bytes(budget)} does not hold the weights ({format_bytes(self.weights_bytes)}) "
                f"even streamed ({exc}): raise the budget or quantize the weights (memwarden.quantize)"
            ) from None
        self.weights_bytes = state_bytes(self.model) + self.streamer.staging_bytes
        self._note("stream", f"weights streamed from {directory}: {format_bytes(self.weights_bytes)} resident",
                   budget_bytes=budget, resident_bytes=self.weights_bytes)  # fmt: skip

    def pool_blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.spec.block_size)

    def _pool_blocks_for(self, budget_bytes: int) -> int:
        """Default pool size under a budget: ``kv_fraction`` of what the weights leave, capped at a
        few sequences of the model's full context (more is memory no request can use)."""
        spare = budget_bytes - self.weights_bytes
        # With streamed weights the placement kept exactly the activation reserve free: never give it to KV.
        reserve = self.activation_reserve_bytes if getattr(self, "streamer", None) is not None else 0
        blocks = self.spec.blocks_for_bytes(int(min(spare * self.kv_fraction, spare - reserve)))
        text = self.model.config.get_text_config(decoder=True)
        max_tokens = _POOL_SEQUENCES * int(getattr(text, "max_position_embeddings", 0) or 4096)
        return min(blocks, self.pool_blocks_for_tokens(max_tokens))

    def _note(self, kind: str, label: str, **details: Any) -> None:
        """Record a decision in the session's log and on the timeline of a running capture."""
        from memwarden.capture.live.capture import annotate

        self.events.append({"t_s": time.monotonic(), "kind": kind, "label": label, **details})
        annotate(kind, label, **details)

    def set_budget(self, budget: str | int, *, temporary: bool = False) -> None:
        """A new fixed budget; the pool follows before the next request.

        ``temporary=True`` (a squeeze that will end): the session makes no allocation while the
        budget is below what it holds — requests wait for it to come back (up to ``max_wait_s``)
        rather than resize under a limit that may refuse even the resize."""
        self._fixed_budget = parse_bytes(budget)
        self._budget_lowered = temporary and self._fixed_budget < self._initial_budget
        self._note("budget", f"budget set to {format_bytes(self._fixed_budget)}", budget_bytes=self._fixed_budget)
        if not self._budget_lowered:  # under a squeeze, allocating a new pool could itself fail: wait it out
            self.follow_budget()

    def on_telemetry(self, sample: Any, *, in_use_bytes: int | None = None) -> int:
        """Feed one telemetry sample to the session's budget controller (created on first use,
        capped at the fixed budget); returns the budget it implies.

        ``in_use_bytes``: what the session holds that the sample's available memory already
        excludes — by default all it holds (live telemetry of this process's device); pass 0
        when replaying a log recorded without this session."""
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
        if self._budget_source is None or not hasattr(self._budget_source, "update"):
            self._budget_source = BudgetController(cap_bytes=self._fixed_budget)
            # heat / power / fps never push the budget below what serving needs at all
            self._budget_source.floor_bytes = self.working_set_bytes
        before = self.budget_bytes
        self._budget_source.update(sample, in_use_bytes=self.held_bytes if in_use_bytes is None else in_use_bytes)
        after = self.budget_bytes
        if after != before:
            self._note("budget", f"telemetry: budget {format_bytes(before)} -> {format_bytes(after)}",
                       budget_bytes=after, temp_c=sample.temp_c, power_w=sample.power_w, fps=sample.fps)  # fmt: skip
            self.follow_budget()
        return after

    def follow_budget(self) -> None:
        """Resize the KV pool to the current budget (between requests), through the swap tier.

        Telemetry may call this from another thread: the resize holds the session's lock, so a
        request never starts on a pool that is half swapped out."""
        if not self._lock.acquire(blocking=False):
            return  # a request is being admitted or served (its admission shrinks the pool itself); the next re-checks
        try:
            self._follow_budget_locked()
        finally:
            self._lock.release()

    def _follow_budget_locked(self) -> None:
        budget = self.budget_bytes
        want = self._pool_blocks_for(budget) if self._user_blocks is None else self._user_blocks
        have = self.pool.num_blocks
        over = self.held_bytes > budget
        if self._user_blocks is not None and not over:
            return
        if over:  # shrink until what the session holds fits, keeping room for activations
            want = min(want, self._pool_blocks_for(budget))
        if want < 1:
            self._note("degrade", "budget below the weights plus one KV block: nothing left to shrink",
                       budget_bytes=budget, weights_bytes=self.weights_bytes)  # fmt: skip
            return
        if want == have or (not over and abs(want - have) < max(1, have // 10)):
            return  # within 10%: not worth a resize
        if self.encoder_cache is not None and over:
            self.encoder_cache.store.clear()
        self._resize_pool(want, budget, "follow the budget")

    # -- budget ---------------------------------------------------------------------------

    @property
    def budget_bytes(self) -> int:
        limits = [b for b in (self._fixed_budget, getattr(self._budget_source, "budget_bytes", None)) if b is not None]
        return int(min(limits)) if limits else 2**62

    @property
    def held_bytes(self) -> int:
        """Bytes the session holds between requests: weights, the KV pool, cached encoder outputs."""
        store = self.encoder_cache.store if self.encoder_cache is not None else None
        return self.weights_bytes + self.pool.nbytes + int(getattr(store, "nbytes", 0) or 0)

    @property
    def working_set_bytes(self) -> int:
        """The least the session serves with: its weights, the smallest KV pool and the activation reserve."""
        return self.weights_bytes + self._min_pool_bytes + max(0, self.activation_reserve_bytes)

    def _admissible(self, budget: int) -> int:
        """The most a request may be predicted to use: the budget less the safety margin (kernel
        workspaces, per-thread buffers and the session's bookkeeping are not in the prediction)."""
        return budget - max(int(budget * self.safety_fraction), _MIN_SAFETY_BYTES)

    def _resize_pool(self, blocks: int, budget: int, why: str) -> None:
        import tempfile

        have = self.pool.num_blocks
        self.pool = self.pool.resized(blocks, self.swap_dir or tempfile.gettempdir())
        self._note("kv-pool", f"KV pool {have} -> {blocks} blocks ({format_bytes(self.pool.nbytes)}): {why}",
                   budget_bytes=budget, blocks=blocks, kept_cached_blocks=len(self.pool.blocks.cached))  # fmt: skip
