"""Paged KV-cache block pool: prefix reuse by content, LRU eviction, invariants under random use."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memwarden.runtime.blocks import BlockPool, NoFreeBlocks, block_hash

IMAGE_A, IMAGE_B = ["img:aaaa"], ["img:bbbb"]


def test_same_image_and_prompt_reuses_full_blocks() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    tokens = list(range(10))  # 2 full blocks + 2 tokens
    first = pool.allocate("a", tokens, extra=[IMAGE_A, IMAGE_A])
    assert first.num_cached_tokens == 0
    second = pool.allocate("b", tokens + [99], extra=[IMAGE_A, IMAGE_A])
    assert second.num_cached_tokens == 8
    assert second.block_ids[:2] == first.block_ids[:2]  # shared
    assert second.block_ids[2] != first.block_ids[2]  # the partial block is never shared
    pool.check()


def test_another_image_with_the_same_tokens_is_not_reused() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    tokens = list(range(8))
    pool.allocate("a", tokens, extra=[IMAGE_A, IMAGE_A])
    other = pool.allocate("b", tokens, extra=[IMAGE_B, IMAGE_B])
    assert other.num_cached_tokens == 0
    assert block_hash(None, tokens[:4], IMAGE_A) != block_hash(None, tokens[:4], IMAGE_B)


def test_freed_blocks_stay_cached_until_reused_and_evict_oldest_first() -> None:
    pool = BlockPool(num_blocks=4, block_size=2)
    pool.allocate("a", [1, 2, 3, 4])  # blocks 0, 1
    pool.free_sequence("a")  # freed tail first: 1 then 0
    again = pool.allocate("a2", [1, 2, 3, 4])  # a later turn with the same prefix: a hit
    assert again.num_cached_tokens == 4 and pool.evictions == 0
    pool.free_sequence("a2")
    pool.allocate("c", [7, 8, 9, 10, 11, 12])  # needs 3 blocks: 2 never-used + the oldest cached
    # the cached prefix's tail block went first (freed first); its head block survives
    assert pool.evictions == 1
    assert pool.allocate("d", [1, 2]).num_cached_tokens == 2
    pool.check()


def test_exhaustion_is_all_or_nothing() -> None:
    pool = BlockPool(num_blocks=3, block_size=2)
    pool.allocate("a", [1, 2, 3, 4])
    with pytest.raises(NoFreeBlocks):
        pool.allocate("b", [5, 6, 7, 8])
    assert pool.num_free_blocks == 1 and "b" not in pool.tables
    pool.check()


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "free"]), st.integers(0, 5), st.integers(0, 3), st.integers(1, 20)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(2, 12), st.integers(1, 4))
def test_invariants_under_random_use(script, num_blocks: int, block_size: int) -> None:
    pool = BlockPool(num_blocks=num_blocks, block_size=block_size)
    prefixes = [list(range(p * 100, p * 100 + 40)) for p in range(4)]
    live: list[str] = []
    for i, (op, slot, prefix, length) in enumerate(script):
        if op == "alloc":
            seq = f"s{i}"
            tokens = prefixes[prefix][:length]
            before = pool.num_free_blocks
            try:
                got = pool.allocate(seq, tokens, extra=[[f"img{prefix}"]] * len(tokens))
            except NoFreeBlocks:
                assert pool.num_free_blocks == before
            else:
                live.append(seq)
                assert len(got.block_ids) == pool.blocks_needed(len(tokens))
                assert got.num_cached_tokens <= len(tokens)
                assert len(set(got.block_ids)) == len(got.block_ids)
        elif live:
            pool.free_sequence(live.pop(slot % len(live)))
        pool.check()
    for seq in live:
        pool.free_sequence(seq)
    pool.check()
    assert pool.num_free_blocks == num_blocks
