"""A conversation's next turn reuses the partial last block of the previous turn: it prefills only the
tokens after the previous turn's last cached token, as a careful user's ``DynamicCache`` does."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memwarden.models import zoo
from memwarden.runtime.blocks import BlockPool, NoFreeBlocks
from memwarden.runtime.session import GovernedSession

IMAGE = ["img:aaaa"]


def test_a_committed_partial_tail_is_taken_over_by_the_next_turn() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    turn1 = list(range(10))  # 2 full blocks + 2 tokens
    first = pool.allocate("a", turn1, extra=[IMAGE] * 3, register=False)
    assert pool.commit("a", turn1, extra=[IMAGE] * 3) == 3  # the partial tail is advertised too
    pool.free_sequence("a")
    turn2 = turn1 + [50, 51, 52, 53, 54]
    assert pool.cached_prefix_tokens(turn2, [IMAGE] * 4) == 10
    assert pool.cached_prefix_blocks(turn2, [IMAGE] * 4) == 2  # full blocks alone stop at 8
    second = pool.allocate("b", turn2, extra=[IMAGE] * 4, register=False, max_hit_tokens=14)
    assert second.num_cached_tokens == 10
    assert second.block_ids[:3] == first.block_ids  # the tail block is now this sequence's own
    assert pool.blocks[first.block_ids[2]].hash is None  # and out of the cache: its content will grow
    assert pool.cached_prefix_tokens(turn2, [IMAGE] * 4) == 8
    pool.check()


def test_a_partial_tail_needs_the_same_parent_tokens_and_media() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    turn1 = list(range(6))
    pool.allocate("a", turn1, extra=[IMAGE] * 2, register=False)
    pool.commit("a", turn1, extra=[IMAGE] * 2)
    pool.free_sequence("a")
    assert pool.cached_prefix_tokens(turn1 + [9], [IMAGE] * 2) == 6
    assert pool.cached_prefix_tokens(turn1 + [9], [IMAGE] * 2, max_tokens=5) == 5  # fewer of its tokens
    # diverges inside the tail: the block is found by the hash of all it holds (4, 5), so only whole tails count
    assert pool.cached_prefix_tokens([0, 1, 2, 3, 4, 7, 9], [IMAGE] * 2) == 4
    assert pool.cached_prefix_tokens(turn1 + [9], [IMAGE, ["img:bbbb"]]) == 4  # another image in the block
    assert pool.cached_prefix_tokens([7] + turn1[1:] + [9], [IMAGE] * 2) == 0  # another parent


def test_a_referenced_partial_tail_is_never_shared() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    turn1 = list(range(6))
    first = pool.allocate("a", turn1, register=False)
    pool.commit("a", turn1)  # not freed: its owner may still write into the tail
    assert pool.cached_prefix_tokens(turn1 + [9]) == 4
    other = pool.allocate("b", turn1 + [9], register=False, max_hit_tokens=6)
    assert other.num_cached_tokens == 4 and other.block_ids[1] != first.block_ids[1]
    pool.check()


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "finish", "drop"]), st.integers(0, 5), st.integers(0, 2), st.integers(1, 20)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(2, 12), st.integers(1, 5))
def test_reused_slots_always_hold_the_kv_of_the_same_prefix(script, num_blocks: int, block_size: int) -> None:
    """A model of the pool's contents: each slot holds the prefix its KV was computed from. Whatever
    the order of allocations, commits, frees and evictions, every reused token's slot holds exactly
    the new sequence's prefix up to that token, and no sequence writes a slot another can read."""
    pool = BlockPool(num_blocks=num_blocks, block_size=block_size)
    prefixes = [[p * 100 + (i % 7) for i in range(40)] for p in range(3)]  # repeats inside: partial look-alikes
    held: dict[int, tuple[int, ...]] = {}  # slot -> the prefix whose last token's KV it holds
    live: dict[str, list[int]] = {}
    for i, (op, slot, prefix, length) in enumerate(script):
        if op == "alloc":
            seq, tokens = f"s{i}", prefixes[prefix][:length]
            try:
                got = pool.allocate(seq, tokens, register=False, max_hit_tokens=len(tokens) - 1)
            except NoFreeBlocks:
                continue
            assert got.num_cached_tokens <= len(tokens) - 1
            for p in range(len(tokens)):
                at = got.block_ids[p // block_size] * block_size + p % block_size
                if p < got.num_cached_tokens:
                    assert held.get(at) == tuple(tokens[: p + 1])
                else:  # written: the block is this sequence's alone and advertised nowhere yet
                    block = pool.blocks[got.block_ids[p // block_size]]
                    assert block.ref_count == 1 and block.hash is None
                    held[at] = tuple(tokens[: p + 1])
            live[seq] = tokens
        elif live:
            seq = sorted(live)[slot % len(live)]
            tokens = live.pop(seq)
            if op == "finish":
                pool.commit(seq, tokens)
            pool.free_sequence(seq)
        pool.check()


NEW = 6


@pytest.mark.parametrize("name", ["llava", "gemma3"])
def test_chat_turns_prefill_only_what_follows_the_last_cached_token(name):
    """Turn N+1 prefills its new message and the reply's last token (whose KV the reply never wrote),
    not the tail of the last full block again; replies equal a plain chat loop's."""
    model = zoo.build_model(name, "tiny")
    gk = zoo.generate_kwargs(name)
    first = zoo.make_inputs(model, prompt_tokens=30, seed=3)
    g = torch.Generator().manual_seed(3)
    messages = [torch.randint(3, 200, (1, n), generator=g) for n in (9, 5, 11)]
    media = {k: v for k, v in first.items() if k not in ("input_ids", "attention_mask")}
    with torch.inference_mode():
        session = GovernedSession(model, budget="1GiB")
        replies = [session.chat(first["input_ids"], max_new_tokens=NEW, **media, **gk)]
        replies += [session.chat(m, max_new_tokens=NEW, **gk) for m in messages]
        history, ref = first["input_ids"], []
        type_ids = {k: v for k, v in media.items() if k.endswith("type_ids")}
        other = {k: v for k, v in media.items() if k not in type_ids}
        for m in [None, *messages]:
            history = history if m is None else torch.cat([history, m], 1)
            pad = {k: torch.nn.functional.pad(v, (0, history.shape[1] - v.shape[1])) for k, v in type_ids.items()}
            out = model.generate(
                input_ids=history, attention_mask=torch.ones_like(history), max_new_tokens=NEW, **other, **pad, **gk
            )
            ref.append(out[:, history.shape[1] :])
            history = out
    for got, want in zip(replies, ref, strict=True):
        assert torch.equal(got, want)
    bs = session.spec.block_size
    for rec, msg, prev in zip(session.records[1:], messages, session.records[:-1], strict=True):
        written_before = prev.prompt_tokens + prev.new_tokens - 1  # the previous turn's last cached token
        assert rec.reused_tokens == written_before
        assert rec.prompt_tokens - rec.reused_tokens == msg.shape[1] + 1
        assert not rec.media_reencoded
    assert any(rec.reused_tokens % bs for rec in session.records[1:])  # the tails were not block-aligned
