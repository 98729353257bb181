"""The caching-allocator model against hand-computed cases and invariants.

Every expectation below is worked out from the rules in
c10/cuda/CUDACachingAllocator.cpp (kMinBlockSize 512 B, kSmallSize 1 MiB,
kSmallBuffer 2 MiB, kLargeBuffer 20 MiB, kMinLargeAlloc 10 MiB, kRoundLarge 2 MiB).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memwarden.plan.allocator.config import AllocatorConfig, SimulatedOOM, parse_alloc_conf
from memwarden.plan.allocator.model import CachingAllocatorModel
from memwarden.plan.allocator.replay import _allocator_rows, _run
from memwarden.plan.replay import replay
from memwarden.trace.model import Action, TraceBuilder

KiB = 1 << 10
MiB = 1 << 20

JSON_KEYS = {
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "fragmentation",
    "reserved_unallocated_at_peak_bytes",
    "largest_free_block_at_peak_bytes",
    "segments_at_peak",
    "num_alloc_retries",
    "oom_at_event",
}


def build(ops: list[tuple], device: str = "cuda:0"):
    """ops: ("a", id, nbytes) allocates, ("f", id) frees, ("p", id, nbytes) is PREEXISTING."""
    b = TraceBuilder(devices=[device])
    sizes: dict[int, int] = {}
    for t, op in enumerate(ops):
        if op[0] == "f":
            b.event(t, Action.FREE, op[1], 0, sizes[op[1]], device=device)
        else:
            action = Action.PREEXISTING if op[0] == "p" else Action.ALLOC
            b.event(t, action, op[1], 0, op[2], device=device)
            sizes[op[1]] = op[2]
    return b.build()


def phases(*groups: tuple[int, int]) -> list[tuple]:
    """Each group (count, nbytes): allocate `count` tensors, then free them all."""
    ops: list[tuple] = []
    next_id = 0
    for count, nbytes in groups:
        ids = list(range(next_id, next_id + count))
        next_id += count
        ops += [("a", i, nbytes) for i in ids]
        ops += [("f", i) for i in ids]
    return ops


def snapshot_balances(segments: list[dict]) -> None:
    """The check inside `python -m torch.cuda._memory_viz stats` (segsum), per segment and in total."""
    total = internal = external = allocated = 0
    for seg in segments:
        s_internal = s_external = s_allocated = 0
        for block in seg["blocks"]:
            if block["state"] == "active_allocated":
                s_allocated += block["requested_size"]
                s_internal += block["size"] - block["requested_size"]
            else:
                s_external += block["size"]
        assert s_internal + s_external + s_allocated == seg["total_size"]
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
        assert seg["requested_size"] == s_allocated
        total += seg["total_size"]
        internal, external, allocated = internal + s_internal, external + s_external, allocated + s_allocated
    assert internal + external + allocated == total


# -- the worked examples ------------------------------------------------------------------


def test_eight_16mib_then_four_32mib_reserve_256mib():
    # 16 MiB >= kMinLargeAlloc: each gets its own 16 MiB segment (rounded to kRoundLarge).
    # Freed, they stay cached; no 16 MiB block fits 32 MiB, so four new 32 MiB segments.
    result = replay(build(phases((8, 16 * MiB), (4, 32 * MiB))))
    assert result.peak_reserved_bytes == 256 * MiB
    assert result.peak_allocated_bytes == 128 * MiB
    assert result.segments_at_peak == 12
    # at the peak (the fourth 32 MiB segment) eight 16 MiB blocks sit cached and unusable
    assert result.reserved_unallocated_at_peak_bytes == 128 * MiB
    assert result.fragmentation == pytest.approx(0.5)
    assert result.largest_free_block_at_peak_bytes == 16 * MiB


def test_four_32mib_then_eight_16mib_reserve_128mib():
    # Each 16 MiB request best-fits a cached 32 MiB block and splits it (remainder 16 MiB > 1 MiB).
    result = replay(build(phases((4, 32 * MiB), (8, 16 * MiB))))
    assert result.peak_reserved_bytes == 128 * MiB
    assert result.segments_at_end_snapshot and len(result.segments_at_end_snapshot) == 4
    for seg in result.segments_at_end_snapshot:
        assert [b["state"] for b in seg["blocks"]] == ["inactive"]  # halves merged back


def test_expandable_segments_map_seven_20mib_pages():
    # With expandable segments the large pool is one growing segment mapped in 20 MiB
    # pages (Note [Expandable Segments]). Eight 16 MiB tensors are 128 MiB, and each
    # malloc maps just enough pages for itself at the end: ceil(128 / 20) = 7 pages
    # = 140 MiB. Freed, they merge into one 140 MiB block that holds all four 32 MiB
    # tensors, so the second phase maps nothing. The source agrees with the write-up.
    result = replay(build(phases((8, 16 * MiB), (4, 32 * MiB))), allocator="pytorch-expandable")
    assert result.peak_reserved_bytes == 7 * 20 * MiB
    end = result.segments_at_end_snapshot
    assert len(end) == 1 and end[0]["is_expandable"] and end[0]["total_size"] == 140 * MiB
    model = CachingAllocatorModel(AllocatorConfig(expandable_segments=True))
    blocks = [model.malloc(16 * MiB) for _ in range(8)]
    assert model.num_device_alloc == 7  # seven page mappings
    assert model.reserved_bytes == 140 * MiB
    for b in blocks:
        model.free(b)
    [model.malloc(32 * MiB) for _ in range(4)]
    assert model.reserved_bytes == 140 * MiB and model.num_device_alloc == 7


# -- rounding and splitting ---------------------------------------------------------------


def test_512_byte_rounding():
    model = CachingAllocatorModel()
    sizes = {}
    for n in (1, 511, 512, 513, 1000, 4097):
        sizes[n] = model.malloc(n)
    # 1, 511, 512 -> 512; 513, 1000 -> 1024; 4097 -> 4608
    assert model.allocated_bytes == 3 * 512 + 2 * 1024 + 4608
    segs = model.segments()
    blocks = [b for b in segs[0]["blocks"] if b["state"] == "active_allocated"]
    assert [b["size"] for b in blocks] == [512, 512, 512, 1024, 1024, 4608]
    assert [b["requested_size"] for b in blocks] == [1, 511, 512, 513, 1000, 4097]
    snapshot_balances(segs)


def test_zero_byte_allocations_are_skipped_in_replay():
    result = replay(build([("a", 1, 0), ("a", 2, 100), ("f", 1), ("f", 2)]))
    assert result.peak_allocated_bytes == 512
    with pytest.raises(ValueError):
        CachingAllocatorModel().malloc(0)


def test_small_pool_packs_2mib_segments_and_splits_down_to_512():
    model = CachingAllocatorModel()
    first = model.malloc(1000)
    second = model.malloc(1000)
    assert model.reserved_bytes == 2 * MiB  # kSmallBuffer
    assert second == first + 1024  # carved from the remainder of the same segment
    # fill the segment exactly: 2 MiB = 2048 blocks of 1 KiB
    rest = [model.malloc(1024) for _ in range(2046)]
    assert model.reserved_bytes == 2 * MiB
    (seg,) = model.segments()
    assert all(b["state"] == "active_allocated" for b in seg["blocks"])
    model.malloc(1)  # the 2049th block needs a new small segment
    assert model.reserved_bytes == 4 * MiB
    for addr in [first, second, *rest]:
        model.free(addr)
    model.check_invariants()
    segs = model.segments()
    assert segs[0]["blocks"] == [
        {"address": first, "size": 2 * MiB, "requested_size": 0, "state": "inactive", "frames": []}
    ]
    assert all(s["segment_type"] == "small" for s in segs)


def test_small_pool_splits_a_remainder_of_exactly_512():
    model = CachingAllocatorModel()
    a = model.malloc(2 * MiB - 1024)  # > 1 MiB: large pool, 20 MiB segment
    assert model.reserved_bytes == 20 * MiB
    model.free(a)
    small = model.malloc(MiB)  # <= 1 MiB: small pool, its own 2 MiB segment
    model.malloc(MiB - 512)  # remainder of that segment is 1 MiB: split leaves 512 B
    assert model.reserved_bytes == 22 * MiB
    (seg_small,) = [s for s in model.segments() if s["segment_type"] == "small"]
    assert [b["size"] for b in seg_small["blocks"]] == [MiB, MiB - 512, 512]
    del small


def test_large_pool_split_needs_more_than_1mib_remainder():
    model = CachingAllocatorModel()
    model.malloc(11 * MiB)  # >= 10 MiB: a 12 MiB segment; the remainder of exactly 1 MiB is NOT split
    assert model.reserved_bytes == 12 * MiB and model.allocated_bytes == 12 * MiB
    model.malloc(int(1.5 * MiB))  # 1-10 MiB: a 20 MiB segment, the 18.5 MiB remainder is split off
    assert model.reserved_bytes == 32 * MiB
    assert model.allocated_bytes == 12 * MiB + int(1.5 * MiB)
    b = model.malloc(10 * MiB + 1024)  # fits the 18.5 MiB remainder; 8.5 MiB - 1 KiB left > 1 MiB: split
    assert model.reserved_bytes == 32 * MiB
    assert model.allocated_bytes == 12 * MiB + int(1.5 * MiB) + 10 * MiB + 1024
    model.free(b)
    model.check_invariants()


def test_best_fit_takes_smallest_then_lowest_address():
    model = CachingAllocatorModel()
    big = [model.malloc(s) for s in (40 * MiB, 24 * MiB, 24 * MiB, 30 * MiB)]
    for addr in big:
        model.free(addr)
    # 22 MiB fits 24, 24, 30 and 40: the best fit is a 24 MiB block, the lower one
    got = model.malloc(22 * MiB)
    assert got == min(big[1], big[2])
    # remainder 2 MiB > 1 MiB: split
    assert model.allocated_bytes == 22 * MiB


# -- max_split_size and oversize blocks ----------------------------------------------------


def test_oversize_blocks_follow_max_split_size():
    config = AllocatorConfig(max_split_size_bytes=32 * MiB)
    model = CachingAllocatorModel(config)
    model.free(model.malloc(64 * MiB))  # an oversize (>= 32 MiB) cached block
    model.malloc(16 * MiB)  # < max_split_size: may not use the oversize block
    assert model.reserved_bytes == 80 * MiB
    x = model.malloc(40 * MiB)  # >= max_split: 64 >= 40 + 20 MiB is too wasteful: new segment
    assert model.reserved_bytes == 120 * MiB
    model.free(x)
    y = model.malloc(48 * MiB)  # 40 and 64 are cached; best fit is... 40 < 48, so 64: 64 < 48 + 20
    assert model.reserved_bytes == 120 * MiB
    assert model.allocated_bytes == 16 * MiB + 64 * MiB  # oversize blocks are never split
    model.free(y)
    model.check_invariants()


def test_max_non_split_rounding_widens_what_an_oversize_request_may_take():
    model = CachingAllocatorModel(parse_alloc_conf("max_split_size_mb:32,max_non_split_rounding_mb:30"))
    model.free(model.malloc(64 * MiB))
    model.malloc(40 * MiB)  # 64 < 40 + 30 MiB: reuses the cached block
    assert model.reserved_bytes == 64 * MiB


def test_oversize_cached_blocks_are_released_before_the_full_retry():
    # limit 100 MiB, max_split 20 MiB. Cached oversize 64 MiB; 24 MiB in use.
    config = AllocatorConfig(max_split_size_bytes=20 * MiB, limit_bytes=100 * MiB)
    result = replay(build([("a", 1, 64 * MiB), ("f", 1), ("a", 2, 24 * MiB), ("a", 3, 30 * MiB)]), config)
    # 30 MiB: 64 >= 30 + 20 is rejected; 88 + 30 > 100 fails; release_available_cached_blocks
    # frees the 64 MiB block (the smallest oversize >= 30 MiB) and the cudaMalloc succeeds.
    assert result.oom_at_event is None
    assert result.num_alloc_retries == 0  # the release-everything retry was not needed
    assert int(result.reserved_bytes[-1]) == 54 * MiB
    assert result.peak_reserved_bytes == 88 * MiB


# -- roundup_power2_divisions --------------------------------------------------------------


def test_roundup_power2_divisions():
    config = AllocatorConfig(roundup_power2_divisions=4)
    # 1200 KiB lies in [1024, 2048) KiB; four divisions: 1024, 1280, 1536, 1792 -> 1280 KiB
    assert config.round_size(1200 * KiB) == 1280 * KiB
    assert config.round_size(1024 * KiB) == 1024 * KiB  # a power of two stays
    assert config.round_size(1536 * KiB + 1) == 1792 * KiB
    assert config.round_size(2000) == 2048  # 2000 > 512 * 4: 1024 + 4 * 256 -> 2048
    assert config.round_size(1500) == 1536  # 1500 <= 512 * 4: plain 512 rounding
    model = CachingAllocatorModel(config)
    model.malloc(1200 * KiB)
    assert model.allocated_bytes == 1280 * KiB
    # per-interval list: [256:1,512:2,>:4] (MiB keys; the first also covers smaller sizes)
    listed = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,>:4]")
    assert listed.round_size(300 * MiB + 1) == 300 * MiB + 512  # 256 MiB interval: 1 division = off
    assert listed.round_size(600 * MiB) == 768 * MiB  # 512 MiB interval, 2 divisions: 512, 768
    assert listed.round_size(1100 * MiB) == 1280 * MiB  # 1024: 4 divisions of 256 MiB


def test_alloc_conf_roundtrip_matches_pytorch_test_expectations():
    # from c10/test/core/AllocatorConfig_test.cpp
    conf = parse_alloc_conf("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]")
    assert [conf.divisions_for(m * MiB) for m in (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)] == [
        8,
        8,
        2,
        4,
        2,
        4,
        1,
        1,
        1,
    ]
    conf = parse_alloc_conf("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]")
    assert [conf.divisions_for(m * MiB) for m in (64, 128, 256, 512, 1024, 2048, 4096)] == [8, 8, 16, 1, 0, 8, 2]
    assert parse_alloc_conf("roundup_power2_divisions:4").divisions_for(2048 * MiB) == 4


# -- limits, retries, OOM -------------------------------------------------------------------


def test_retry_succeeds_only_because_cached_blocks_were_released():
    # limit 40 MiB: a cached 16 MiB segment plus a new 32 MiB one would be 48 MiB.
    trace = build([("a", 1, 16 * MiB), ("f", 1), ("a", 2, 32 * MiB)])
    result = replay(trace, AllocatorConfig(limit_bytes=40 * MiB))
    assert result.oom_at_event is None
    assert result.num_alloc_retries == 1
    assert result.peak_reserved_bytes == 32 * MiB
    assert result.reserved_bytes.tolist() == [16 * MiB, 16 * MiB, 32 * MiB]
    unlimited = replay(trace)
    assert unlimited.peak_reserved_bytes == 48 * MiB and unlimited.num_alloc_retries == 0


def test_oom_sets_the_event_and_stops():
    trace = build([("a", 1, 16 * MiB), ("a", 2, 32 * MiB), ("f", 1), ("f", 2)])
    result = replay(trace, AllocatorConfig(limit_bytes=40 * MiB))
    assert result.oom_at_event == 1
    assert result.num_alloc_retries == 1  # it did try the release-everything retry
    assert len(result.allocated_bytes) == 2 and result.allocated_bytes.tolist() == [16 * MiB, 16 * MiB]
    assert result.to_json()["oom_at_event"] == 1
    model = CachingAllocatorModel(AllocatorConfig(limit_bytes=40 * MiB))
    model.malloc(16 * MiB)
    with pytest.raises(SimulatedOOM):
        model.malloc(32 * MiB)
    assert model.num_ooms == 1


def test_expandable_segments_oom_unmaps_free_pages_then_retries():
    # limit 80 MiB; the large pool maps 20 MiB pages
    model = CachingAllocatorModel(AllocatorConfig(expandable_segments=True, limit_bytes=80 * MiB))
    a = model.malloc(30 * MiB)  # maps pages 0-1 (40 MiB); [30, 40) stays free
    base = a
    b = model.malloc(30 * MiB)  # the free 10 MiB plus page 2 (20 MiB): [30, 60)
    assert b == base + 30 * MiB and model.reserved_bytes == 60 * MiB
    model.free(a)  # [0, 30) free: page 0 wholly free, page 1 half free
    # 35 MiB: nothing cached fits; 60 + 36 (rounded) > 80 fails; the retry first unmaps
    # page 0 (reserved 40), then maps two new pages after b: [60, 100), reserved 80
    c = model.malloc(35 * MiB)
    assert c == base + 60 * MiB
    assert model.reserved_bytes == 80 * MiB and model.num_alloc_retries == 1
    assert model.allocated_bytes == 65 * MiB
    model.check_invariants()
    ranges = [(s["address"] - base, s["total_size"]) for s in model.segments()]
    assert ranges == [(20 * MiB, 80 * MiB)]  # one mapped run: pages 1-4


def test_garbage_collection_frees_old_cached_segments_under_a_fraction():
    ops = [("a", 1, 60 * MiB), ("f", 1), ("a", 2, 70 * MiB)]
    plain = replay(build(ops), AllocatorConfig(limit_bytes=100 * MiB))
    # 60 cached + 70 new > 100: the allocation needs the release-everything retry
    assert plain.num_alloc_retries == 1 and int(plain.reserved_bytes[-1]) == 70 * MiB
    gc = replay(build(ops), AllocatorConfig(limit_bytes=100 * MiB, garbage_collection_threshold=0.5))
    # reserved 60 MiB > 0.5 * 100 MiB: the cached segment is collected before cudaMalloc, no retry
    assert gc.num_alloc_retries == 0 and int(gc.reserved_bytes[-1]) == 70 * MiB


# -- config parsing ---------------------------------------------------------------------


def test_parse_alloc_conf():
    conf = parse_alloc_conf(
        "max_split_size_mb:128, roundup_power2_divisions:4,expandable_segments:True,garbage_collection_threshold:0.6"
    )
    assert conf.max_split_size_bytes == 128 * MiB
    assert conf.roundup_power2_divisions == 4
    assert conf.expandable_segments is True
    assert conf.garbage_collection_threshold == 0.6
    assert parse_alloc_conf("") == AllocatorConfig()
    assert parse_alloc_conf("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False").expandable_segments is False
    assert parse_alloc_conf(conf.to_alloc_conf()) == conf


@pytest.mark.parametrize(
    "text, words",
    [
        ("foo:1", "unknown option 'foo'"),
        ("max_split_size_mb:10", "too small"),
        ("max_split_size_mb:abc", "integer"),
        ("max_split_size_mb", "expected"),
        ("expandable_segments:yes", "True or False"),
        ("roundup_power2_divisions:3", "power of 2"),
        ("roundup_power2_divisions:[64:8", "not closed"),
        ("garbage_collection_threshold:1.5", "(0.0, 1.0)"),
        ("backend:cudaMallocAsync", "not modelled"),
        ("expandable_segments:True max_split_size_mb:64", "True or False"),  # spaces vanish, as in lexArgs
    ],
)
def test_parse_alloc_conf_errors(text, words):
    with pytest.raises(ValueError) as info:
        parse_alloc_conf(text)
    assert words in str(info.value)
    assert "\n" not in str(info.value)


# -- replay plumbing -------------------------------------------------------------------------


def test_replay_json_keys_and_per_row_arrays():
    b = TraceBuilder(devices=["cuda:0", "cuda:1"])
    b.event(0, Action.PREEXISTING, 1, 0, 3 * MiB, device="cuda:0")
    b.event(1, Action.MAP, 2, 0, 100 * MiB, device="cuda:0")  # file-backed: ignored
    b.event(2, Action.ALLOC, 3, 0, 5 * MiB, device="cuda:1")  # other device: ignored
    b.event(3, Action.ALLOC, 4, 0, 1000, device="cuda:0")
    b.event(4, Action.FREE, 99, 0, 1000, device="cuda:0")  # never allocated: ignored
    b.event(5, Action.FREE, 4, 0, 1000, device="cuda:0")
    result = replay(b.build())
    assert set(result.to_json()) == JSON_KEYS
    assert result.allocated_bytes.tolist() == [3 * MiB, 3 * MiB, 3 * MiB, 3 * MiB + 1024, 3 * MiB + 1024, 3 * MiB]
    assert result.reserved_bytes.tolist() == [20 * MiB] * 3 + [22 * MiB] * 3
    assert result.peak_event == 3
    other = replay(b.build(), device=1)
    assert other.peak_reserved_bytes == 20 * MiB
    snapshot_balances(result.segments_at_peak_snapshot)


@pytest.mark.parametrize("allocator", ["pytorch", "pytorch-expandable", "arena"])
def test_replay_of_a_trace_without_allocations(allocator):
    b = TraceBuilder(devices=["cuda:0"])
    empty = replay(b.build(), allocator=allocator, history_columns=4)
    assert empty.peak_reserved_bytes == 0 and empty.oom_at_event is None and len(empty.allocated_bytes) == 0
    b.event(0, Action.MAP, 1, 0, 100 * MiB, device="cuda:0")  # file-backed only
    mapped = replay(b.build(), allocator=allocator)
    assert mapped.to_json() == {**empty.to_json()}
    assert mapped.allocated_bytes.tolist() == [0] and mapped.segments_at_end_snapshot == []


def test_history_columns_are_recorded():
    result = replay(build(phases((8, 16 * MiB), (4, 32 * MiB))), history_columns=5)
    assert result.history is not None
    assert len(result.history.event_index) == len(result.history.blocks) == 5
    assert result.history.event_index[-1] == 23
    last_blocks = result.history.blocks[-1]
    assert int(last_blocks[:, 1].sum()) == 256 * MiB  # everything cached at the end


# -- properties over random traces -----------------------------------------------------------

SIZES = st.one_of(
    st.integers(1, 4096),
    st.integers(4096, 2 * MiB),
    st.integers(2 * MiB, 24 * MiB),
    st.sampled_from([512, MiB, MiB + 1, 10 * MiB - 1, 10 * MiB, 20 * MiB, 64 * MiB]),
)


@st.composite
def random_ops(draw):
    ops: list[tuple] = []
    live: list[int] = []
    next_id = 0
    for _ in range(draw(st.integers(1, 80))):
        if live and draw(st.booleans()):
            victim = live.pop(draw(st.integers(0, len(live) - 1)))
            ops.append(("f", victim))
        else:
            ops.append(("a", next_id, draw(SIZES)))
            live.append(next_id)
            next_id += 1
    if draw(st.booleans()):
        ops += [("f", i) for i in live]
    return ops


CONFIGS = st.sampled_from(
    [
        AllocatorConfig(),
        AllocatorConfig(expandable_segments=True),
        AllocatorConfig(max_split_size_bytes=20 * MiB),
        AllocatorConfig(roundup_power2_divisions=4),
        AllocatorConfig(limit_bytes=96 * MiB),
        AllocatorConfig(max_split_size_bytes=24 * MiB, limit_bytes=80 * MiB),
        AllocatorConfig(expandable_segments=True, limit_bytes=100 * MiB),
        AllocatorConfig(limit_bytes=120 * MiB, garbage_collection_threshold=0.3),
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=random_ops(), config=CONFIGS)
def test_allocator_invariants(ops, config):
    model = CachingAllocatorModel(config)
    live: dict[int, int] = {}
    for op in ops:
        if op[0] == "f":
            model.free(live.pop(op[1]))
        else:
            try:
                live[op[1]] = model.malloc(op[2])
            except SimulatedOOM:
                break
        model.check_invariants()  # blocks tile segments, sums match, free lists consistent
        assert model.allocated_bytes <= model.reserved_bytes
        segs = model.segments()
        snapshot_balances(segs)
        spans = sorted((b["address"], b["size"]) for s in segs for b in s["blocks"])
        for (a0, s0), (a1, _) in zip(spans, spans[1:], strict=False):
            assert a0 + s0 <= a1  # blocks never overlap
        addresses = {b["address"] for s in segs for b in s["blocks"] if b["state"] == "active_allocated"}
        assert addresses == set(live.values())
    for addr in live.values():
        model.free(addr)
    model.check_invariants()
    assert model.allocated_bytes == 0
    for seg in model.segments():  # every block came back and merged: one free block per segment
        assert [b["state"] for b in seg["blocks"]] == ["inactive"]


@settings(max_examples=60, deadline=None)
@given(ops=random_ops(), config=CONFIGS)
def test_replay_matches_stepping_the_model(ops, config):
    trace = build(ops)
    result = replay(trace, config)
    model = CachingAllocatorModel(config)
    live: dict[int, int] = {}
    allocated, reserved = [], []
    for op in ops:
        if op[0] == "f":
            if op[1] in live:
                model.free(live.pop(op[1]))
        else:
            try:
                live[op[1]] = model.malloc(op[2])
            except SimulatedOOM:
                allocated.append(model.allocated_bytes)
                reserved.append(model.reserved_bytes)
                break
        allocated.append(model.allocated_bytes)
        reserved.append(model.reserved_bytes)
    assert result.allocated_bytes.tolist() == allocated
    assert result.reserved_bytes.tolist() == reserved
    assert result.peak_reserved_bytes == max(reserved)
    assert result.peak_allocated_bytes == max(allocated)
    assert result.segments_at_end_snapshot == model.segments()
    snapshot_balances(result.segments_at_peak_snapshot)
    assert sum(s["total_size"] for s in result.segments_at_peak_snapshot) == result.peak_reserved_bytes
    assert 0.0 <= result.fragmentation <= 1.0


def test_run_returns_per_row_lists():
    trace = build(phases((3, 5 * MiB)))
    rows, acts, tensors, nbytes = _allocator_rows(trace, 0)
    allocated, reserved, stop, layouts = _run(CachingAllocatorModel(), acts, tensors, nbytes, len(rows), [])
    assert stop == 6 and layouts == []
    assert np.asarray(reserved).max() == 20 * MiB  # three 5 MiB blocks carved from one 20 MiB segment


@pytest.mark.parametrize("allocator", ["pytorch", "pytorch-expandable", "arena"])
def test_snapshots_pass_torch_memory_viz_stats(allocator):
    """`python -m torch.cuda._memory_viz stats` runs segsum, which asserts the balance per segment."""
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    ops = phases((3, 700), (2, 3 * MiB), (8, 16 * MiB)) + [("a", 100, 5000), ("a", 101, 25 * MiB)]
    result = replay(build(ops), allocator=allocator)
    for segments in (result.segments_at_peak_snapshot, result.segments_at_end_snapshot):
        text = memory_viz.segsum({"segments": segments, "device_traces": [[]]})
        assert "total_reserved" in text
