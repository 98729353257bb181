"""The static arena planner: hand-checked plans, validity and bounds on random traces."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memwarden.plan.allocator.config import AllocatorConfig
from memwarden.plan.arena.index import _add_span, _best_gap, _pack
from memwarden.plan.arena.plan import STRATEGIES, lifetimes, plan_arena
from memwarden.plan.replay import replay
from memwarden.trace.model import Action, TraceBuilder


def build(ops: list[tuple], devices: tuple[str, ...] = ("cuda:0",)):
    """ops: ("a"|"p", id, nbytes[, device]) allocate / preexist, ("f", id) frees, ("m", id, nbytes) maps a file."""
    b = TraceBuilder(devices=list(devices))
    info: dict[int, tuple[int, str]] = {}
    for t, op in enumerate(ops):
        kind = op[0]
        if kind == "f":
            nbytes, device = info[op[1]]
            b.event(t, Action.FREE, op[1], 0, nbytes, device=device)
            continue
        device = op[3] if len(op) > 3 else devices[0]
        action = {"a": Action.ALLOC, "p": Action.PREEXISTING, "m": Action.MAP}[kind]
        b.event(t, action, op[1], 0, op[2], device=device)
        info[op[1]] = (op[2], device)
    return b.build()


def brute_force_valid(plan) -> bool:
    for i, j in itertools.combinations(range(len(plan.sizes)), 2):
        live_together = plan.first[i] <= plan.last[j] and plan.first[j] <= plan.last[i]
        if not live_together or not plan.sizes[i] or not plan.sizes[j]:
            continue
        if plan.offsets[i] < plan.offsets[j] + plan.sizes[j] and plan.offsets[j] < plan.offsets[i] + plan.sizes[i]:
            return False
    return True


def test_lifetimes_pair_allocs_with_frees():
    trace = build(
        [
            ("p", 1, 1000),  # row 0, preexisting: first 0, never freed
            ("a", 2, 64),  # row 1
            ("m", 3, 4096),  # row 2, file-backed: not a record
            ("a", 4, 128, "cuda:1"),  # row 3, other device
            ("f", 2),  # row 4
            ("a", 5, 256),  # row 5, never freed
        ],
        devices=("cuda:0", "cuda:1"),
    )
    life = lifetimes(trace, device=0)
    assert life.tensor.tolist() == [1, 2, 5]
    assert life.first.tolist() == [0, 1, 5]
    assert life.last.tolist() == [5, 4, 5]  # never freed: live to the last row
    assert life.freed.tolist() == [False, True, False]
    assert lifetimes(trace, device=1).tensor.tolist() == [4]


def test_preexisting_counts_from_row_zero():
    trace = build([("a", 1, 64), ("f", 1), ("p", 2, 64)])
    life = lifetimes(trace)
    assert life.first.tolist() == [0, 0]  # the PREEXISTING row sits at row 2 but was alive before
    plan = plan_arena(trace)
    assert plan.arena_bytes == 128  # they overlap at row 0


def test_greedy_by_size_reuses_dead_space_hand_checked():
    # rows: 0 a(A,256) 1 a(B,128) 2 f(A) 3 a(C,192) 4 f(B) 5 f(C)
    trace = build([("a", 1, 256), ("a", 2, 128), ("f", 1), ("a", 3, 192), ("f", 2), ("f", 3)])
    plan = plan_arena(trace, "greedy-by-size")
    by_id = {t["id"]: t for t in plan.tensors}
    # by size: A (256) at 0; C (192) does not meet A ([0,2] vs [3,5]) -> 0;
    # B (128) meets A and C: the only place is on top of them, at 256
    assert by_id[1]["offset"] == 0 and by_id[3]["offset"] == 0 and by_id[2]["offset"] == 256
    assert plan.arena_bytes == 384
    assert plan.lower_bound_bytes == 384  # rows 1 and 3: 256 + 128 and 128 + 192
    assert plan.naive_bytes == 576
    assert by_id[2] == {"id": 2, "offset": 256, "bytes": 128, "first": 1, "last": 4}


def test_gap_rule_takes_the_smallest_fitting_gap_else_the_top():
    # TFLite's rule: among gaps between the spans of overlapping placed records
    def packed(pairs):
        return [_pack(a, b) for a, b in pairs]

    spans = packed([(0, 64), (320, 384), (512, 576)])  # gaps [64, 320) = 256 and [384, 512) = 128
    assert _best_gap(spans, 128) == 384  # the tighter gap, though a lower one fits too
    assert _best_gap(spans, 200) == 64
    assert _best_gap(spans, 300) == 576  # nothing fits: on top of the highest
    assert _best_gap(packed([(64, 128)]), 64) == 0  # the gap below the first span counts
    assert _best_gap(packed([(0, 100), (50, 80), (120, 130)]), 20) == 100  # spans may overlap each other
    union: list[int] = []
    for a, b in [(10, 20), (30, 40), (20, 30), (0, 5), (35, 50), (60, 70), (12, 14)]:
        _add_span(union, a, b)
    assert union == packed([(0, 5), (10, 50), (60, 70)])


def test_a_small_tensor_reuses_space_below_long_lived_ones():
    ops = [
        ("a", 1, 640),  # row 0: big, dies at row 3
        ("a", 2, 64),  # row 1: lives long
        ("a", 3, 64),  # row 2: lives long
        ("f", 1),  # row 3
        ("a", 4, 64),  # row 4: small, fits a gap
        ("f", 2),
        ("f", 3),
        ("f", 4),
    ]
    plan = plan_arena(build(ops), "greedy-by-size", alignment=64)
    assert brute_force_valid(plan)
    assert plan.arena_bytes == plan.lower_bound_bytes == 768
    # record 4 (row 4) meets records 2 and 3 only; they sit at 640 and 704; gap [0, 640) fits at 0
    assert plan.tensors[3]["offset"] == 0


def test_alignment_rounds_sizes_and_offsets():
    trace = build([("a", 1, 1), ("a", 2, 65), ("a", 3, 100)])
    plan = plan_arena(trace, alignment=64)
    assert plan.sizes.tolist() == [64, 128, 128]
    assert all(t["offset"] % 64 == 0 for t in plan.tensors)
    assert plan_arena(trace, alignment=256).arena_bytes == 768
    with pytest.raises(ValueError):
        plan_arena(trace, alignment=0)
    with pytest.raises(ValueError, match="unknown arena strategy"):
        plan_arena(trace, "first-fit")


def test_best_keeps_the_smaller_plan_and_json():
    trace = build([("a", 1, 256), ("a", 2, 128), ("f", 1), ("a", 3, 192), ("f", 2), ("f", 3)])
    best = plan_arena(trace, "best")
    assert best.arena_bytes == min(plan_arena(trace, s).arena_bytes for s in ("greedy-by-size", "greedy-by-breadth"))
    data = best.to_json()
    assert {"arena_bytes", "lower_bound_bytes", "naive_bytes", "tensors"} <= set(data)
    assert set(data["tensors"][0]) == {"id", "offset", "bytes", "first", "last"}


def test_empty_trace():
    plan = plan_arena(build([]))
    assert plan.arena_bytes == plan.lower_bound_bytes == plan.naive_bytes == 0
    assert plan.tensors == []


def test_replay_through_the_arena():
    ops = [("p", 9, 1000), ("a", 1, 256), ("a", 2, 128), ("f", 1), ("a", 3, 192), ("f", 2), ("f", 3)]
    trace = build(ops)
    plan = plan_arena(trace)
    result = replay(trace, allocator="arena", history_columns=4)
    assert result.peak_reserved_bytes == plan.arena_bytes
    assert result.reserved_bytes.tolist() == [plan.arena_bytes] * len(ops)
    assert result.peak_allocated_bytes == 1024 + 256 + 128
    assert result.segments_at_peak == 1
    seg = result.segments_at_peak_snapshot[0]
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"] == plan.arena_bytes
    assert result.history is not None and len(result.history.blocks) == 4
    too_small = replay(trace, AllocatorConfig(limit_bytes=plan.arena_bytes - 1), allocator="arena")
    assert too_small.oom_at_event == 0


@st.composite
def random_traces(draw):
    ops: list[tuple] = []
    live: list[int] = []
    next_id = 0
    sizes = st.one_of(st.integers(0, 300), st.integers(1, 1 << 20), st.sampled_from([64, 128, 4096]))
    for _ in range(draw(st.integers(0, 3))):  # weights: preexisting, never freed
        ops.append(("p", next_id, draw(sizes)))
        next_id += 1
    for _ in range(draw(st.integers(0, 70))):
        if live and draw(st.booleans()):
            ops.append(("f", live.pop(draw(st.integers(0, len(live) - 1)))))
        else:
            ops.append(("a", next_id, draw(sizes)))
            live.append(next_id)
            next_id += 1
    return build(ops)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=random_traces(), strategy=st.sampled_from(STRATEGIES), alignment=st.sampled_from([1, 16, 64]))
def test_arena_plans_are_valid_and_bounded(trace, strategy, alignment):
    plan = plan_arena(trace, strategy, alignment=alignment)
    assert plan.overlapping_pairs() == []
    assert brute_force_valid(plan)
    assert plan.lower_bound_bytes <= plan.arena_bytes <= plan.naive_bytes
    assert np.all(plan.offsets % alignment == 0)
    assert np.all(plan.offsets >= 0)
    if len(plan.sizes):
        assert plan.arena_bytes == int((plan.offsets + plan.sizes).max())


def test_many_records_stay_valid():
    """Big enough to use the bucket unions (more than 1024 records) and long lifetimes."""
    rng = np.random.default_rng(3)
    ops: list[tuple] = [("p", i, int(rng.integers(1, 5000))) for i in range(5)]
    live: list[int] = []
    next_id = 5
    for _ in range(6000):
        if live and rng.random() < 0.48:
            # mostly free the newest (stack-like), sometimes an old one (long lifetime)
            k = len(live) - 1 if rng.random() < 0.8 else int(rng.integers(0, len(live)))
            ops.append(("f", live.pop(k)))
        else:
            ops.append(("a", next_id, int(rng.integers(1, 100_000))))
            live.append(next_id)
            next_id += 1
    trace = build(ops)
    for strategy in ("greedy-by-size", "greedy-by-breadth"):
        plan = plan_arena(trace, strategy)
        assert plan.overlapping_pairs() == []
        assert plan.lower_bound_bytes <= plan.arena_bytes
        assert plan.arena_bytes <= 1.3 * plan.lower_bound_bytes  # greedy is near the bound on stack-like lifetimes


def naive_place(order: list[int], first: np.ndarray, last: np.ndarray, sizes: np.ndarray) -> list[int]:
    """TFLite's greedy placement written the O(n^2) way: the reference for the indexed one."""
    placed: list[int] = []
    offsets = [0] * len(sizes)
    for r in order:
        if not sizes[r]:
            continue
        spans = sorted(
            _pack(offsets[p], offsets[p] + int(sizes[p])) for p in placed if first[p] <= last[r] and first[r] <= last[p]
        )
        offsets[r] = _best_gap(spans, int(sizes[r]))
        placed.append(r)
    return offsets


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=random_traces())
def test_indexed_placement_equals_the_quadratic_reference(trace):
    from memwarden.plan.arena.index import OverlapIndex
    from memwarden.plan.arena.plan import _size_order

    life = lifetimes(trace)
    sizes = -(-life.nbytes // 64) * 64
    order = _size_order(life, sizes)
    got = OverlapIndex(life.first, life.last).place(order, sizes).tolist()
    assert got == naive_place(order, life.first, life.last, sizes)


def test_indexed_placement_equals_the_reference_on_a_long_trace():
    rng = np.random.default_rng(11)
    n = 3000
    first = np.sort(rng.integers(0, 4000, n))
    last = first + rng.choice([1, 5, 50, 800, 4000], n)
    first[:4] = 0
    last[:4] = last.max()  # whole-trace records
    sizes = rng.integers(1, 40, n) * 64
    from memwarden.plan.arena.index import OverlapIndex

    order = np.lexsort((np.arange(n), first, -sizes)).tolist()
    got = OverlapIndex(first, last).place(order, sizes).tolist()
    assert got == naive_place(order, first, last, sizes)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=random_traces())
def test_arena_replay_snapshots_balance(trace):
    result = replay(trace, allocator="arena")
    plan = plan_arena(trace)
    assert result.peak_reserved_bytes == (plan.arena_bytes if len(plan.sizes) else 0)
    assert result.peak_allocated_bytes <= result.peak_reserved_bytes
    for segments in (result.segments_at_peak_snapshot, result.segments_at_end_snapshot):
        for seg in segments:
            addr = seg["address"]
            internal = external = allocated = 0
            for block in seg["blocks"]:
                assert block["address"] == addr
                addr += block["size"]
                if block["state"] == "active_allocated":
                    allocated += block["requested_size"]
                    internal += block["size"] - block["requested_size"]
                else:
                    external += block["size"]
            assert addr - seg["address"] == seg["total_size"] == internal + external + allocated
