"""Paged KV-cache block management with content-hash prefix reuse (pure Python, no torch).

The bookkeeping half of the paged KV cache that ``GovernedSession`` will own (the tensors
live in ``runtime/kvcache.py``): a fixed pool of blocks of ``block_size`` tokens, allocated
once; per-sequence block tables; reference counts; and a free queue that is also the LRU
of cached blocks. Modelled on vLLM v1's KV cache manager:

- A *full* block's hash covers its parent's hash, its token ids and ``extra`` keys — the
  content fingerprints of the image/audio items that overlap the block — so the same image
  in a later request hashes to the same blocks and is neither re-encoded nor re-prefilled.
  Only full blocks are shared (a partial block's content is still changing).
- A sequence's last, *partial* block is cached too once its KV is written (:meth:`BlockPool.commit`),
  under a hash that covers its length (so it never matches a full block): a conversation's next
  turn extends exactly those tokens, so it takes the block over — unreferenced, it leaves the cache
  and becomes the new sequence's own block, whose free slots it fills — and prefills only the
  tokens after the previous turn's last cached one, as a ``DynamicCache`` passed back would. A
  partial block still referenced is never shared (its owner may still write into it).
- A freed block keeps its hash and stays findable until it is reused: freeing puts it at
  the tail of the free queue; allocation takes from the head, evicting the oldest cached
  content first. A sequence's blocks are freed tail first, so its longest prefixes are
  evicted first and its shared leading blocks survive longest.
- The free queue is a doubly linked list, not a deque, because a cache hit must take a
  block out of the *middle* of the queue in O(1).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NewType

BlockHash = NewType("BlockHash", bytes)

_ROOT = BlockHash(b"\0" * 16)


def block_hash(parent: BlockHash | None, tokens: Sequence[int], extra: Sequence[str] = ()) -> BlockHash:
    """Hash of a full block: parent hash, token ids and extra keys (media fingerprints)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or _ROOT)
    h.update(len(tokens).to_bytes(4, "little"))
    # the same bytes as each token's int.to_bytes(8, "little", signed=True), packed in one call (per-request cost)
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    for key in extra:
        h.update(b"\x1f" + key.encode())
    return BlockHash(h.digest())


@dataclass(eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    hash: BlockHash | None = None
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)


class FreeQueue:
    """Doubly linked list of free blocks: head = next to hand out (least recently freed)."""

    def __init__(self, blocks: Sequence[Block]) -> None:
        self.head: Block | None = None
        self.tail: Block | None = None
        self.num_free_blocks = 0
        for b in blocks:
            self.append(b)

    def append(self, block: Block) -> None:
        block.prev, block.next = self.tail, None
        if self.tail is None:
            self.head = block
        else:
            self.tail.next = block
        self.tail = block
        self.num_free_blocks += 1

    def remove(self, block: Block) -> None:
        """O(1) removal from anywhere in the queue (a cache hit on a free block)."""
        if block.prev is None:
            self.head = block.next
        else:
            block.prev.next = block.next
        if block.next is None:
            self.tail = block.prev
        else:
            block.next.prev = block.prev
        block.prev = block.next = None
        self.num_free_blocks -= 1

    def popleft(self) -> Block:
        if self.head is None:
            raise NoFreeBlocks("no free KV-cache blocks")
        block = self.head
        self.remove(block)
        return block

    def __iter__(self) -> Iterator[Block]:
        b = self.head
        while b is not None:
            yield b
            b = b.next


class NoFreeBlocks(RuntimeError):
    """The pool is exhausted: admission control should have kept this request waiting."""


@dataclass(frozen=True, kw_only=True)
class Allocation:
    block_ids: list[int]
    num_cached_tokens: int  # leading tokens whose KV is already in the pool (prefix hit)


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` tokens; sequences hold block tables."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free = FreeQueue(self.blocks)
        self.cached: dict[BlockHash, Block] = {}
        self.tables: dict[str, list[Block]] = {}
        self.hits = self.misses = self.evictions = 0
        # The last chain hashed: a request is planned, allocated and committed over the same leading
        # tokens, and a chat's next turn starts with them, so only the blocks after them are hashed.
        self._memo: tuple[list[int], list[tuple[str, ...]], list[BlockHash]] = ([], [], [])

    @property
    def num_free_blocks(self) -> int:
        return self.free.num_free_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _take_free(self) -> Block:
        block = self.free.popleft()
        if block.hash is not None:  # evict its cached content
            if self.cached.get(block.hash) is block:
                del self.cached[block.hash]
            block.hash = None
            self.evictions += 1
        block.ref_count = 1
        return block

    def hashes(self, tokens: Sequence[int], extra: Sequence[Sequence[str]] = ()) -> list[BlockHash]:
        """Chained hashes of the full blocks of ``tokens``."""
        bs = self.block_size
        n = len(tokens) // bs
        keys = [tuple(extra[i]) if i < len(extra) else () for i in range(n)]
        seen_tokens, seen_keys, seen = self._memo
        same = min(n, len(seen))  # leading blocks equal to the memo's (one comparison each way, in C)
        while same and (list(tokens[: same * bs]) != seen_tokens[: same * bs] or keys[:same] != seen_keys[:same]):
            same //= 2
        out = seen[:same]
        parent = out[-1] if out else None
        for i in range(same, n):
            parent = block_hash(parent, tokens[i * bs : (i + 1) * bs], keys[i])
            out.append(parent)
        self._memo = (list(tokens[: n * bs]), keys, out)
        return list(out)

    def cached_prefix_blocks(self, tokens: Sequence[int], extra: Sequence[Sequence[str]] = ()) -> int:
        """How many leading full blocks of ``tokens`` are in the pool (a lookup, nothing changes)."""
        n = 0
        for h in self.hashes(tokens, extra):
            if h not in self.cached:
                break
            n += 1
        return n

    def cached_prefix_tokens(
        self, tokens: Sequence[int], extra: Sequence[Sequence[str]] = (), max_tokens: int | None = None
    ) -> int:
        """How many leading tokens of ``tokens`` (at most ``max_tokens``) have their KV in the pool: the
        cached full blocks, then a free partial block that continues them (a lookup, nothing changes)."""
        limit = len(tokens) if max_tokens is None else min(max_tokens, len(tokens))
        hashes = self.hashes(tokens, extra)
        full = 0
        while full < limit // self.block_size and hashes[full] in self.cached:
            full += 1
        start = full * self.block_size
        if start >= limit:
            return start
        hit = self._partial_hit(hashes[full - 1] if full else None, tokens, full, extra)
        return start + min(hit[1], limit - start) if hit is not None else start

    def _partial_hit(
        self, parent: BlockHash | None, tokens: Sequence[int], index: int, extra: Sequence[Sequence[str]]
    ) -> tuple[Block, int] | None:
        """The free cached partial block that holds the longest run of ``tokens`` from block ``index`` on,
        and how many tokens it holds. One hash per candidate length: fewer than ``block_size`` each."""
        start = index * self.block_size
        keys = extra[index] if index < len(extra) else ()
        for n in range(min(len(tokens) - start, self.block_size - 1), 0, -1):
            b = self.cached.get(block_hash(parent, tokens[start : start + n], keys))
            if b is not None and b.ref_count == 0:
                return b, n
        return None

    def allocate(
        self,
        seq_id: str,
        tokens: Sequence[int],
        extra: Sequence[Sequence[str]] = (),
        *,
        register: bool = True,
        max_hit_blocks: int | None = None,
        max_hit_tokens: int | None = None,
    ) -> Allocation:
        """Block table for a new sequence of ``tokens``, reusing cached full blocks of its prefix.

        ``extra[i]`` are the media fingerprints overlapping block ``i`` (empty if none).
        ``register=False`` leaves new blocks unhashed until :meth:`commit` — for callers that
        fill the KV after allocating and must not advertise blocks whose KV is not written yet.
        ``max_hit_blocks`` caps the reused prefix in full blocks (a caller may need to recompute its
        tail). ``max_hit_tokens`` caps it in tokens and lets it end inside a block: after the cached
        full blocks, a free cached partial block continuing them (see :meth:`commit`) is taken over —
        out of the cache, into this table — and its leading tokens count as cached.
        All-or-nothing: on NoFreeBlocks the pool is left as it was.
        """
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id!r} already has blocks")
        n_blocks = self.blocks_needed(len(tokens))
        hashes = self.hashes(tokens, extra)
        cap = len(hashes)
        if max_hit_blocks is not None:
            cap = min(cap, max_hit_blocks)
        if max_hit_tokens is not None:
            cap = min(cap, max_hit_tokens // self.block_size)
        hit_blocks: list[Block] = []
        for h in hashes[:cap]:
            b = self.cached.get(h)
            if b is None:
                break
            hit_blocks.append(b)
        cached_tokens = len(hit_blocks) * self.block_size
        partial = None
        if max_hit_tokens is not None and max_hit_tokens > cached_tokens:
            parent = hit_blocks[-1].hash if hit_blocks else None
            partial = self._partial_hit(parent, tokens, len(hit_blocks), extra)
        need_new = n_blocks - len(hit_blocks) - (partial is not None)
        reusable_free = sum(1 for b in hit_blocks if b.ref_count == 0) + (partial is not None)
        if need_new > self.num_free_blocks - reusable_free:
            raise NoFreeBlocks(f"need {need_new} free blocks, {self.num_free_blocks - reusable_free} available")
        table: list[Block] = []
        for b in hit_blocks:
            if b.ref_count == 0:
                self.free.remove(b)
            b.ref_count += 1
            table.append(b)
        if partial is not None:  # taken over: its content will grow, so it leaves the cache
            b, held = partial
            assert b.hash is not None and max_hit_tokens is not None  # found in the cache, looked up only then
            self.free.remove(b)
            del self.cached[b.hash]
            b.hash, b.ref_count = None, 1
            table.append(b)
            cached_tokens += min(held, max_hit_tokens - cached_tokens)
        for i in range(len(table), n_blocks):
            b = self._take_free()
            if register and i < len(hashes):
                b.hash = hashes[i]
                self.cached.setdefault(b.hash, b)
            table.append(b)
        self.hits += len(hit_blocks) + (partial is not None)
        self.misses += n_blocks - len(hit_blocks) - (partial is not None)
        self.tables[seq_id] = table
        return Allocation(block_ids=[b.block_id for b in table], num_cached_tokens=cached_tokens)

    def append_block(self, seq_id: str) -> int:
        """One more (unhashed) block at the end of a sequence's table; its id."""
        b = self._take_free()
        self.misses += 1
        self.tables[seq_id].append(b)
        return b.block_id

    def commit(self, seq_id: str, tokens: Sequence[int], extra: Sequence[Sequence[str]] = ()) -> int:
        """Hash and advertise the sequence's blocks whose KV now holds ``tokens``; how many.

        Its full blocks, and its last block if ``tokens`` end inside it: that one is findable by
        :meth:`allocate` (``max_hit_tokens``) once the sequence is freed, and must not be written
        after this call — the caller commits when its sequence is done."""
        table = self.tables[seq_id]
        hashes = self.hashes(tokens, extra)
        full = len(hashes)
        if len(tokens) % self.block_size and full < len(table):
            keys = extra[full] if full < len(extra) else ()
            hashes.append(block_hash(hashes[-1] if hashes else None, tokens[full * self.block_size :], keys))
        n = 0
        for b, h in zip(table, hashes, strict=False):
            if b.hash is None:
                if h in self.cached:  # same content computed twice: keep the older copy findable
                    continue
                b.hash = h
                self.cached[h] = b
                n += 1
        return n

    def free_sequence(self, seq_id: str) -> None:
        """Release a sequence's blocks, tail first (its longest prefixes are evicted first)."""
        table = self.tables.pop(seq_id)
        for b in reversed(table):
            b.ref_count -= 1
            if b.ref_count == 0:
                self.free.append(b)

    def cached_by_recency(self) -> list[BlockHash]:
        """Hashes of the free cached blocks, least recently used first (the eviction order)."""
        return [b.hash for b in self.free if b.hash is not None]

    def restore(self, hashes: Sequence[BlockHash], stats_from: BlockPool | None = None) -> None:
        """On a fresh pool: blocks ``0..len(hashes)-1`` hold ``hashes`` (LRU first). Unhashed blocks
        go to the head of the free queue so that they are handed out before any cached content."""
        if self.tables or len(hashes) > len(self.blocks):
            raise ValueError("restore needs a fresh pool with room for every hash")
        order = self.blocks[len(hashes) :] + self.blocks[: len(hashes)]
        for b, h in zip(self.blocks, hashes, strict=False):
            b.hash = h
            self.cached[h] = b
        self.free = FreeQueue(order)
        if stats_from is not None:
            self.hits, self.misses, self.evictions = stats_from.hits, stats_from.misses, stats_from.evictions

    def check(self) -> None:
        """Invariants (for tests): ref counts match tables, free ⇔ unreferenced, cache is consistent."""
        refs = {b.block_id: 0 for b in self.blocks}
        for table in self.tables.values():
            for b in table:
                refs[b.block_id] += 1
        free_ids = [b.block_id for b in self.free]
        assert len(free_ids) == len(set(free_ids)) == self.num_free_blocks
        for b in self.blocks:
            assert b.ref_count == refs[b.block_id] >= 0
            assert (b.block_id in set(free_ids)) == (b.ref_count == 0)
        for h, b in self.cached.items():
            assert b.hash == h
