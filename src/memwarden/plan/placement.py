"""Tier placement: which weight groups stay resident in the memory the model computes from, and
which are streamed in from a slower tier, so that a request fits a budget.

Pure: plain sizes in, a frozen :class:`Placement` out; no torch. The runtime
(``memwarden.runtime.offload``) measures the groups of a live model and carries a placement out;
``Placement.to_device_map`` hands the same decision to accelerate.

The memory model the budget is checked against (everything in bytes)::

    peak = resident weights + pinned bytes + staging_slots x largest streamed group
           + KV cache + activation peak

Streamed groups are copied into one of ``staging_slots`` staging buffers just before they run
(two: the one computing and the one being prefetched), so they never cost more than that however
many there are. Pinned bytes are what a group cannot stream (buffers, tied weights).

Choice: streaming a group costs its bytes once per forward pass that runs it. Text groups run
at every decode step (``per_token``); encoder and projector groups once per request, so they
are streamed first. Among equals the earliest in execution order stays resident: a resident
prefix gives the prefetch of the first streamed group something to overlap with.

Because the staging term depends on the largest group streamed, a plain greedy can paint itself
into a corner (streaming one big embedding can cost more staging than it frees). So the planner
tries every staging size ``s`` (each group's size, and 0 = nothing streamed): groups larger than
``s`` must be resident, the rest fill the budget by priority, and the cheapest feasible option
wins (fewest bytes streamed per token, then fewest streamed, then least staging).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memwarden.errors import InputError
from memwarden.models.device_profile import MemoryTier

__all__ = ["KV_CACHE", "ItemPlacement", "Placement", "PlacementError", "WeightGroup", "place"]

KV_CACHE = "kv_cache"  # name of the KV-cache item in Placement.items
STAGING_SLOTS = 2  # one group computing, the next being prefetched


class PlacementError(InputError):
    """The budget cannot hold even the smallest streaming configuration."""

    def __init__(self, message: str, *, min_budget_bytes: int) -> None:
        super().__init__(message)
        self.min_budget_bytes = min_budget_bytes


@dataclass(frozen=True, kw_only=True)
class WeightGroup:
    """Weights that move together: one module subtree (a decoder layer, an embedding, a norm)."""

    name: str  # module path; an accelerate device_map key
    weight_bytes: int  # bytes that can be streamed
    order: int  # position in execution order, 0 runs first
    per_token: bool = True  # runs at every decode step (text), not once per request (encoders)
    pinned_bytes: int = 0  # bytes that stay resident whatever the tier (buffers, tied weights)


@dataclass(frozen=True, kw_only=True)
class ItemPlacement:
    name: str
    kind: str  # "weights" | "kv_cache"
    tier: str  # "device" | "host" | "disk": where the bytes live between uses
    nbytes: int  # the bytes that tier holds (weight_bytes for a group)
    streamed: bool  # copied into a staging slot of the compute tier just before use
    per_token: bool = False


@dataclass(frozen=True, kw_only=True)
class Placement:
    items: tuple[ItemPlacement, ...]  # weight groups in execution order, then the KV cache
    compute_tier: str  # the tier the model computes from: "device", or "host" (CPU / unified memory)
    budget_bytes: int
    staging_slots: int
    staging_bytes: int  # staging_slots x the largest streamed group
    pinned_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    predicted_stream_us_per_token: float  # copy time of the per-token streamed bytes at peak bandwidth

    @property
    def weights(self) -> tuple[ItemPlacement, ...]:
        return tuple(i for i in self.items if i.kind == "weights")

    @property
    def resident_weight_bytes(self) -> int:
        """Weights that stay in the compute tier, pinned bytes included."""
        return self.pinned_bytes + sum(i.nbytes for i in self.weights if not i.streamed)

    @property
    def streamed_weight_bytes(self) -> int:
        return sum(i.nbytes for i in self.weights if i.streamed)

    @property
    def streamed_per_token_bytes(self) -> int:
        """Bytes copied in at every decode step."""
        return sum(i.nbytes for i in self.weights if i.streamed and i.per_token)

    @property
    def predicted_peak_bytes(self) -> int:
        return self.resident_weight_bytes + self.staging_bytes + self.kv_cache_bytes + self.activation_bytes

    @property
    def headroom_bytes(self) -> int:
        return self.budget_bytes - self.predicted_peak_bytes

    def streamed_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.weights if i.streamed)

    def resident_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.weights if not i.streamed)

    def tier_of(self, name: str) -> str:
        for i in self.items:
            if i.name == name:
                return i.tier
        raise KeyError(name)

    def to_device_map(self, compute_device: int | str = 0) -> dict[str, int | str]:
        """An accelerate ``device_map``: module path -> ``compute_device`` / "cpu" / "disk".

        ``compute_device`` is what the compute tier is called in torch: a GPU index (default 0), or
        "cpu" when the model computes on the CPU (then streamed groups map to "disk", the only
        tier accelerate offloads from when its main device is the CPU).
        """
        names: dict[str, int | str] = {"host": "cpu", "disk": "disk", self.compute_tier: compute_device}
        return {i.name: names[i.tier] for i in self.weights}

    def to_json(self) -> dict[str, Any]:
        return {
            "compute_tier": self.compute_tier,
            "budget_bytes": self.budget_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "resident_weight_bytes": self.resident_weight_bytes,
            "streamed_weight_bytes": self.streamed_weight_bytes,
            "streamed_per_token_bytes": self.streamed_per_token_bytes,
            "staging_bytes": self.staging_bytes,
            "pinned_bytes": self.pinned_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "activation_bytes": self.activation_bytes,
            "predicted_stream_us_per_token": self.predicted_stream_us_per_token,
            "items": [vars(i) for i in self.items],
        }


def place(
    groups: Sequence[WeightGroup],
    *,
    budget_bytes: int,
    tiers: Sequence[MemoryTier],
    kv_cache_bytes: int = 0,
    activation_bytes: int = 0,
    staging_slots: int = STAGING_SLOTS,
) -> Placement:
    """Place every weight group and the KV cache so that the predicted peak fits ``budget_bytes``.

    ``tiers`` are a device profile's (``DeviceProfile.tiers``): the model computes from
    ``device`` if there is one, else from ``host``; streamed groups live in ``host`` when the
    compute tier is ``device`` (as much as host capacity allows), else on ``disk``.
    Raises PlacementError (with ``min_budget_bytes``) when no choice fits.
    """
    _check(groups, budget_bytes, kv_cache_bytes, activation_bytes, staging_slots)
    by_name = {t.name: t for t in tiers}
    compute = "device" if "device" in by_name else "host"
    if compute not in by_name:
        raise InputError(f"no 'device' or 'host' tier to compute from (tiers: {', '.join(by_name)})")
    if budget_bytes > by_name[compute].capacity_bytes:
        raise InputError(f"budget {budget_bytes} bytes exceeds the {compute} tier's {by_name[compute].capacity_bytes}")

    pinned_bytes = sum(g.pinned_bytes for g in groups)
    fixed_bytes = pinned_bytes + kv_cache_bytes + activation_bytes
    # Fill order for the groups that may stream: per-token groups first, then earliest.
    priority = sorted(groups, key=lambda g: (not g.per_token, g.order, g.name))

    best: tuple[tuple[int, int, int], frozenset[str], int] | None = None
    min_budget_bytes: int | None = None
    for largest_streamed in sorted({0} | {g.weight_bytes for g in groups}):
        must_bytes = sum(g.weight_bytes for g in groups if g.weight_bytes > largest_streamed)
        floor_bytes = fixed_bytes + staging_slots * largest_streamed + must_bytes
        min_budget_bytes = floor_bytes if min_budget_bytes is None else min(min_budget_bytes, floor_bytes)
        if floor_bytes > budget_bytes:
            continue
        used_bytes = floor_bytes
        resident = {g.name for g in groups if g.weight_bytes > largest_streamed}
        for g in priority:
            if g.name not in resident and used_bytes + g.weight_bytes <= budget_bytes:
                resident.add(g.name)
                used_bytes += g.weight_bytes
        streamed = [g for g in groups if g.name not in resident]
        staging_bytes = staging_slots * max((g.weight_bytes for g in streamed), default=0)
        score = (
            sum(g.weight_bytes for g in streamed if g.per_token),
            sum(g.weight_bytes for g in streamed),
            staging_bytes,
        )
        if best is None or score < best[0]:
            best = (score, frozenset(resident), staging_bytes)
    if best is None:
        raise PlacementError(
            f"budget {budget_bytes} bytes cannot hold the pinned bytes, KV cache, activations and "
            f"{staging_slots} staging slots; at least {min_budget_bytes} bytes are needed",
            min_budget_bytes=min_budget_bytes or 0,
        )
    _, kept, staging_bytes = best

    stream_tiers = _stream_tiers(compute, by_name)
    host_left = by_name["host"].capacity_bytes if "host" in stream_tiers else 0
    disk_left = by_name["disk"].capacity_bytes if "disk" in by_name else 0
    tier_of: dict[str, str] = {}
    for g in priority:  # per-token groups get the fast host tier first
        if g.name in kept:
            continue
        if "host" in stream_tiers and g.weight_bytes <= host_left:
            tier_of[g.name], host_left = "host", host_left - g.weight_bytes
        elif "disk" in stream_tiers and g.weight_bytes <= disk_left:
            tier_of[g.name], disk_left = "disk", disk_left - g.weight_bytes
        else:
            raise InputError(f"no tier has room for streamed group {g.name!r} ({g.weight_bytes} bytes)")

    items = []
    stream_us = 0.0
    for g in sorted(groups, key=lambda g: (g.order, g.name)):
        tier = tier_of.get(g.name, compute)
        is_streamed = g.name not in kept
        if is_streamed and g.per_token:
            stream_us += by_name[tier].transfer_us(g.weight_bytes)
        items.append(
            ItemPlacement(
                name=g.name,
                kind="weights",
                tier=tier,
                nbytes=g.weight_bytes,
                streamed=is_streamed,
                per_token=g.per_token,
            )
        )
    items.append(ItemPlacement(name=KV_CACHE, kind="kv_cache", tier=compute, nbytes=kv_cache_bytes, streamed=False))
    return Placement(
        items=tuple(items),
        compute_tier=compute,
        budget_bytes=budget_bytes,
        staging_slots=staging_slots,
        staging_bytes=staging_bytes,
        pinned_bytes=pinned_bytes,
        kv_cache_bytes=kv_cache_bytes,
        activation_bytes=activation_bytes,
        predicted_stream_us_per_token=stream_us,
    )


def _stream_tiers(compute: str, by_name: dict[str, MemoryTier]) -> tuple[str, ...]:
    # A model computing from host memory (CPU, unified memory) has nowhere faster than disk to
    # keep what it streams: host *is* its budget.
    if compute == "device":
        return tuple(t for t in ("host", "disk") if t in by_name)
    return ("disk",) if "disk" in by_name else ()


def _check(
    groups: Sequence[WeightGroup], budget_bytes: int, kv_cache_bytes: int, activation_bytes: int, staging_slots: int
) -> None:
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise InputError(f"weight group names must be unique; repeated: {', '.join(dup)}")
    if KV_CACHE in names:
        raise InputError(f"{KV_CACHE!r} is reserved for the KV-cache item")
    for g in groups:
        if g.weight_bytes < 0 or g.pinned_bytes < 0:
            raise InputError(f"weight group {g.name!r} has negative bytes")
    if min(budget_bytes, kv_cache_bytes, activation_bytes) < 0:
        raise InputError("budget, KV-cache and activation bytes must be non-negative")
    if staging_slots < 1:
        raise InputError(f"staging_slots must be at least 1; got {staging_slots}")
