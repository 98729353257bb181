"""Tier placement (plan/placement.py): invariants over random models and budgets, the device_map
it emits, and the cases a plain greedy gets wrong."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memwarden.errors import InputError
from memwarden.models.device_profile import MemoryTier
from memwarden.models.devices import load_profile
from memwarden.plan.placement import KV_CACHE, PlacementError, WeightGroup, place

MIB = 1 << 20
CPU_TIERS = (
    MemoryTier(name="host", capacity_bytes=1 << 40, bandwidth_gbps=20.0, latency_us=0.1),
    MemoryTier(name="disk", capacity_bytes=1 << 42, bandwidth_gbps=2.0, latency_us=100.0),
)


def _groups(sizes: list[tuple[int, bool, int]]) -> list[WeightGroup]:
    return [
        WeightGroup(name=f"m.{i}", weight_bytes=size, order=i, per_token=per_token, pinned_bytes=pinned)
        for i, (size, per_token, pinned) in enumerate(sizes)
    ]


group_lists = st.lists(
    st.tuples(st.integers(0, 64 * MIB), st.booleans(), st.sampled_from([0, 0, 0, 4096])), min_size=1, max_size=30
)


@settings(max_examples=150, deadline=None)
@given(
    sizes=group_lists,
    budget_fraction=st.floats(0.0, 1.2),
    kv_bytes=st.integers(0, 8 * MIB),
    act_bytes=st.integers(0, 8 * MIB),
)
def test_placement_invariants(sizes, budget_fraction, kv_bytes, act_bytes) -> None:
    groups = _groups(sizes)
    total = sum(g.weight_bytes + g.pinned_bytes for g in groups) + kv_bytes + act_bytes
    budget = int(total * budget_fraction)
    try:
        p = place(groups, budget_bytes=budget, tiers=CPU_TIERS, kv_cache_bytes=kv_bytes, activation_bytes=act_bytes)
    except PlacementError as err:
        assert err.min_budget_bytes > budget
        # The minimum it names is enough.
        p = place(
            groups,
            budget_bytes=err.min_budget_bytes,
            tiers=CPU_TIERS,
            kv_cache_bytes=kv_bytes,
            activation_bytes=act_bytes,
        )
        budget = err.min_budget_bytes

    # every group placed exactly once, plus the KV cache
    names = [i.name for i in p.items]
    assert sorted(names) == sorted([g.name for g in groups] + [KV_CACHE])
    # what the compute tier holds fits the budget
    compute_bytes = sum(i.nbytes for i in p.items if i.tier == p.compute_tier) + p.pinned_bytes
    assert compute_bytes + p.staging_bytes + act_bytes <= budget
    assert p.predicted_peak_bytes <= budget
    # streamed groups live off the compute tier; the staging slots hold the largest of them twice
    streamed = [i for i in p.weights if i.streamed]
    assert all(i.tier == "disk" for i in streamed)
    assert all(i.tier == "host" for i in p.weights if not i.streamed)
    assert p.staging_bytes == 2 * max((i.nbytes for i in streamed), default=0)
    assert p.resident_weight_bytes + p.streamed_weight_bytes == sum(g.weight_bytes + g.pinned_bytes for g in groups)
    # enough budget: nothing streams
    if budget >= total:
        assert not streamed
    # device_map: one entry per group, accelerate's values
    dm = p.to_device_map("cpu")
    assert set(dm) == {g.name for g in groups}
    assert set(dm.values()) <= {"cpu", "disk"}


def test_streams_encoders_before_text_layers() -> None:
    # vision layers run once per request, text layers at every decode step
    groups = [WeightGroup(name=f"vision.{i}", weight_bytes=10 * MIB, order=i, per_token=False) for i in range(4)]
    groups += [WeightGroup(name=f"text.{i}", weight_bytes=10 * MIB, order=4 + i) for i in range(4)]
    p = place(groups, budget_bytes=60 * MIB, tiers=CPU_TIERS)
    assert p.streamed_names() == tuple(f"vision.{i}" for i in range(4))
    assert p.streamed_per_token_bytes == 0


def test_keeps_a_big_group_resident_when_streaming_it_would_cost_more_staging() -> None:
    # A plain greedy keeps layers in order and streams the 33 MiB head, whose two staging slots
    # (66 MiB) then crowd out the layers. Keeping the head resident streams fewer bytes per token.
    groups = [WeightGroup(name=f"layer.{i}", weight_bytes=12 * MIB, order=i) for i in range(8)]
    groups.append(WeightGroup(name="head", weight_bytes=33 * MIB, order=8))
    p = place(groups, budget_bytes=100 * MIB, tiers=CPU_TIERS)
    assert p.tier_of("head") == "host"
    assert p.staging_bytes == 24 * MIB
    assert p.streamed_per_token_bytes == 5 * 12 * MIB
    assert p.predicted_peak_bytes <= 100 * MIB


def test_budget_too_small_names_the_minimum() -> None:
    groups = [WeightGroup(name=f"layer.{i}", weight_bytes=10 * MIB, order=i) for i in range(4)]
    with pytest.raises(PlacementError) as err:
        place(groups, budget_bytes=15 * MIB, tiers=CPU_TIERS, kv_cache_bytes=2 * MIB)
    assert err.value.min_budget_bytes == 22 * MIB
    p = place(groups, budget_bytes=22 * MIB, tiers=CPU_TIERS, kv_cache_bytes=2 * MIB)
    assert p.streamed_names() == tuple(f"layer.{i}" for i in range(4))


def test_discrete_gpu_streams_from_host_and_maps_to_gpu_index() -> None:
    profile = load_profile("l4-24gb")
    groups = [WeightGroup(name=f"layer.{i}", weight_bytes=1 << 30, order=i) for i in range(40)]
    p = place(groups, budget_bytes=20 << 30, tiers=profile.tiers, kv_cache_bytes=1 << 30)
    assert p.compute_tier == "device"
    dm = p.to_device_map()
    assert set(dm.values()) == {0, "cpu"}
    assert all(p.tier_of(n) == "host" for n in p.streamed_names())
    assert p.predicted_stream_us_per_token > 0


def test_unified_memory_device_streams_from_disk() -> None:
    profile = load_profile("jetson-orin-nano-8gb")
    groups = [WeightGroup(name=f"layer.{i}", weight_bytes=500 * MIB, order=i) for i in range(20)]
    p = place(groups, budget_bytes=profile.usable_bytes, tiers=profile.tiers)
    assert p.compute_tier == "host"
    assert {p.tier_of(n) for n in p.streamed_names()} == {"disk"}
    assert set(p.to_device_map(0).values()) == {0, "disk"}


def test_bad_input() -> None:
    g = WeightGroup(name="a", weight_bytes=1, order=0)
    with pytest.raises(InputError):
        place([g, g], budget_bytes=10, tiers=CPU_TIERS)
    with pytest.raises(InputError):
        place([WeightGroup(name="a", weight_bytes=-1, order=0)], budget_bytes=10, tiers=CPU_TIERS)
    with pytest.raises(InputError):
        place([g], budget_bytes=10, tiers=CPU_TIERS[1:])  # nothing to compute from
