"""Paged KV cache tensors: one pool allocated once, block tables per sequence.

``runtime/blocks.py`` does the bookkeeping (which block holds which tokens, prefix hashes,
LRU); this module owns the memory. Every layer's keys and values live in one tensor
allocated when the session starts::

    pool: (2, num_layers, num_kv_heads, num_blocks * block_size, head_dim)

so the KV cache never grows by concatenation (the ``kv-concat-growth`` pattern) and its
bytes are known before the first request. A token at position ``p`` of a sequence lives in
slot ``table[p // block_size] * block_size + p % block_size``.

:class:`PagedCache` is a transformers ``Cache`` over one sequence's block table, so a model's
own ``generate()`` and ``forward()`` run on it unchanged. ``update`` writes the new states
into their slots and returns the sequence's keys/values gathered into one contiguous
``(1, heads, T, head_dim)`` tensor: the same values, shape and layout ``DynamicCache`` would
return, so attention computes exactly the same numbers. The gathered copy is a temporary of
one layer, freed when the layer's attention is done — the price of paging without a paged
attention kernel, and bounded (it is what admission control budgets as activation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from memwarden.runtime.blocks import BlockPool, NoFreeBlocks


@dataclass(frozen=True, kw_only=True)
class KVSpec:
    """Shape of one model's KV cache; byte arithmetic lives here."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int = 16

    @classmethod
    def from_config(cls, config: Any, dtype: torch.dtype = torch.float32, block_size: int = 16) -> KVSpec:
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        heads = int(text.num_attention_heads)
        head_dim = getattr(text, "head_dim", None) or int(text.hidden_size) // heads
        return cls(
            num_layers=int(text.num_hidden_layers),
            num_kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            dtype=dtype,
            block_size=block_size,
        )

    @property
    def bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.bytes_per_token

    def blocks_for_bytes(self, num_bytes: int) -> int:
        return max(0, num_bytes // self.page_size_bytes)


class KVPool:
    """The KV tensors of ``num_blocks`` blocks for every layer, and their :class:`BlockPool`."""

    def __init__(self, spec: KVSpec, num_blocks: int, device: torch.device | str = "cpu") -> None:
        if num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.spec = spec
        num_slots = num_blocks * spec.block_size
        # (2, layers, kv_heads, slots, head_dim): one allocation, made once, before any bookkeeping
        # (a pool the device cannot hold fails here, having cost nothing).
        self.data = torch.empty(
            (2, spec.num_layers, spec.num_kv_heads, num_slots, spec.head_dim), dtype=spec.dtype, device=device
        )
        self.blocks = BlockPool(num_blocks, spec.block_size)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks.blocks)

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def keys(self, layer: int) -> torch.Tensor:
        return self.data[0, layer]  # (kv_heads, slots, head_dim)

    def values(self, layer: int) -> torch.Tensor:
        return self.data[1, layer]

    def figures(self) -> dict[str, int]:
        """What ``GovernedSession.stats()`` reports of the pool: its size, its blocks and prefix reuse."""
        blocks = self.blocks
        return {
            "kv_pool_bytes": self.nbytes,
            "kv_blocks": self.num_blocks,
            "kv_free_blocks": blocks.num_free_blocks,
            "kv_cached_blocks": len(blocks.cached),
            "block_size": self.spec.block_size,
            "prefix_hits": blocks.hits,
            "prefix_misses": blocks.misses,
            "evictions": blocks.evictions,
        }

    def resized(self, num_blocks: int, swap_dir: str) -> KVPool:
        """A pool of ``num_blocks`` keeping the most recently used cached blocks that fit.

        Between requests only (no sequence holds blocks). Every cached block goes through a file
        in ``swap_dir`` — the lower tier — so that the old and the new pool are never in memory
        together: the peak of a resize is the larger pool plus one staging block, which is what
        lets the session shrink under a budget that just fell below old + new. On a GPU the
        blocks are staged through one host buffer (pinned, so the copies are plain DMA).

        The swap file outlives the old pool until the new one is allocated and filled: if the new
        pool cannot be allocated, this pool is rebuilt from the file at its old size, unchanged,
        and the error propagates. Only if that fails too is the file left on disk (its path is in
        the error) instead of being lost with the data.
        """
        import os
        import tempfile

        if self.blocks.tables:
            raise RuntimeError("cannot resize the KV pool while sequences hold blocks")
        keep = self.blocks.cached_by_recency()[-num_blocks:] if num_blocks > 0 else []
        cached_ids = sorted(b.block_id for b in self.blocks.cached.values())
        kept_ids = [self.blocks.cached[h].block_id for h in keep]
        device = self.data.device
        old_num_blocks = self.num_blocks
        fd, path = tempfile.mkstemp(prefix="kv-swap-", suffix=".bin", dir=swap_dir)
        swap = _SwapFile(path, self.spec, device)
        try:
            with os.fdopen(fd, "wb") as f:
                for i in cached_ids:
                    swap.write_block(f, self.block(i))
            self.data = self.data.new_empty(0)  # the old pool goes; its blocks are safe in the file
            try:
                new = KVPool(self.spec, max(1, num_blocks), device=device)
            except BaseException:
                self.data = KVPool(self.spec, old_num_blocks, device=device).data
                swap.read_into(self, cached_ids, cached_ids)
                raise
            swap.read_into(new, cached_ids, kept_ids)
        except BaseException as exc:
            if self.data.numel() == 0:  # neither pool exists: the file is all that is left of the blocks
                exc.add_note(f"the KV pool could not be rebuilt; its cached blocks are kept in {path}")
                raise
            os.unlink(path)
            raise
        os.unlink(path)
        new.blocks.restore(keep, stats_from=self.blocks)
        new.blocks.evictions += len(self.blocks.cached) - len(keep)
        return new

    def block(self, block_id: int) -> torch.Tensor:
        """One block of every layer: a view ``(2, layers, kv_heads, block_size, head_dim)``."""
        bs = self.spec.block_size
        return self.data[:, :, :, block_id * bs : (block_id + 1) * bs]


class _SwapFile:
    """Blocks of a pool in a file, in the order written, staged through one host buffer."""

    def __init__(self, path: str, spec: KVSpec, device: torch.device) -> None:
        self.path = path
        shape = (2, spec.num_layers, spec.num_kv_heads, spec.block_size, spec.head_dim)
        pinned = device.type == "cuda"
        # (2, layers, kv_heads, block_size, head_dim) on the host: the only copy of a block in flight
        self.host = torch.empty(shape, dtype=spec.dtype, pin_memory=pinned)
        self.host_bytes = self.host.reshape(-1).view(torch.uint8)

    def write_block(self, f: Any, block: torch.Tensor) -> None:
        self.host.copy_(block)  # device -> host (synchronous: the buffer is reused next block)
        f.write(self.host_bytes.numpy().data)

    def read_into(self, pool: KVPool, written_ids: list[int], wanted_ids: list[int]) -> None:
        """Copy the blocks ``wanted_ids`` (a subset of ``written_ids``, in any order) into ``pool``'s
        blocks ``0..len(wanted_ids)``, or into the same ids when the lists are equal (a rebuild)."""
        position = {block_id: k for k, block_id in enumerate(written_ids)}
        same_ids = wanted_ids == written_ids
        with open(self.path, "rb") as f:
            for j, block_id in enumerate(wanted_ids):
                f.seek(position[block_id] * len(self.host_bytes))
                f.readinto(self.host_bytes.numpy().data)
                pool.block(block_id if same_ids else j).copy_(self.host)


class Sequence:
    """One sequence's view of the pool: its block table and how many tokens hold KV."""

    def __init__(self, pool: KVPool, seq_id: str, block_ids: list[int], num_cached_tokens: int) -> None:
        self.pool = pool
        self.seq_id = seq_id
        self.block_ids = list(block_ids)
        self.length = num_cached_tokens  # tokens whose KV is in the pool
        self._slots: torch.Tensor | None = None  # slot index of every position, grown with the table

    @property
    def capacity(self) -> int:
        return len(self.block_ids) * self.pool.spec.block_size

    def reserve(self, num_tokens: int) -> None:
        """Make room for ``num_tokens`` in total, taking blocks from the pool as needed."""
        while self.capacity < num_tokens:
            self.block_ids.append(self.pool.blocks.append_block(self.seq_id))
            self._slots = None

    def slots(self, stop: int) -> torch.Tensor:
        """Slot indices of positions ``0..stop`` (a view of one cached index tensor)."""
        if self._slots is None or self._slots.numel() < stop:
            bs = self.pool.spec.block_size
            device = self.pool.data.device  # index_copy_/index_select want the index on the pool's device
            table = torch.tensor(self.block_ids, dtype=torch.long, device=device)
            pos = torch.arange(self.capacity, dtype=torch.long, device=device)
            self._slots = table[pos // bs] * bs + pos % bs
        return self._slots[:stop]


class PagedLayer(CacheLayerMixin):
    """One decoder layer's cache over a sequence's block table (a transformers cache layer)."""

    is_sliding = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, seq: Sequence, layer_idx: int) -> None:
        super().__init__()
        self.seq = seq
        self.layer_idx = layer_idx
        self.is_initialized = True
        self.length = seq.length
        self.device = seq.pool.data.device
        # (kv_heads, slots, head_dim) views of this layer, made once: the pool does not move during a request
        self.k_pool, self.v_pool = seq.pool.keys(layer_idx), seq.pool.values(layer_idx)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        return None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # key_states: (1, kv_heads, n, head_dim)
        if key_states.shape[0] != 1:
            raise ValueError("a PagedCache holds one sequence (batch size 1)")
        n = key_states.shape[-2]
        start, stop = self.length, self.length + n
        self.seq.reserve(stop)
        slots = self.seq.slots(stop)
        k_pool, v_pool = self.k_pool, self.v_pool
        k_pool.index_copy_(1, slots[start:], key_states[0].to(k_pool.dtype))
        v_pool.index_copy_(1, slots[start:], value_states[0].to(v_pool.dtype))
        self.length = stop
        self.seq.length = max(self.seq.length, stop)
        # (1, kv_heads, T, head_dim), contiguous: what DynamicCache would hold (one copy per layer and
        # step, as DynamicCache's cat is; bench_session.py prints the two side by side)
        keys = k_pool.index_select(1, slots).unsqueeze(0).to(key_states.dtype)
        values = v_pool.index_select(1, slots).unsqueeze(0).to(value_states.dtype)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length = 0

    def offload(self) -> None:  # the pool does not move layer by layer
        return None

    def prefetch(self) -> None:
        return None


class PagedCache(Cache):
    """A transformers ``Cache`` over one :class:`Sequence` of a :class:`KVPool`."""

    def __init__(self, seq: Sequence) -> None:
        layers: list[Any] = [PagedLayer(seq, i) for i in range(seq.pool.spec.num_layers)]
        super().__init__(layers=layers)
        self.seq = seq

    @property
    def batch_size(self) -> int:
        return 1

    @property
    def kv_pool_tensors(self) -> list[torch.Tensor]:
        """The pool's storage, for captures that tag KV-cache memory."""
        return [self.seq.pool.data]


_CACHE_KEYWORDS: dict[type, str] = {}


def cache_keyword(model: Any) -> str:
    """The ``generate()`` keyword a model takes its cache by: ``cache`` in transformers releases that
    renamed it, ``past_key_values`` before (both are in use: GPU images pin older releases). Read once
    per model class: ``inspect.signature`` costs ~50 µs, on every request otherwise."""
    import inspect

    keyword = _CACHE_KEYWORDS.get(type(model))
    if keyword is None:
        keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        _CACHE_KEYWORDS[type(model)] = keyword
    return keyword


__all__ = ["KVPool", "KVSpec", "NoFreeBlocks", "PagedCache", "PagedLayer", "Sequence", "cache_keyword"]
