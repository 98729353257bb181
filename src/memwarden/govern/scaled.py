"""Replay a device's telemetry against a smaller memory share.

A log recorded on an 8 GB board drives budgets of gigabytes; a demo or a test serves a model
of megabytes. Scaling every memory figure of the log *and* every byte parameter of the policy
by one factor scales the budget the policy computes by that factor (the policy is linear in
memory), while temperature, power and frame rate — what makes the budget move — stay as
recorded. The factor is chosen so that the first sample's budget is the share asked for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from memwarden.govern.budget import BudgetController, BudgetPolicy, DefaultPolicy
from memwarden.govern.telemetry import TelemetrySample

_MEMORY_FIELDS = ("mem_total_bytes", "mem_available_bytes", "swap_used_bytes", "swap_total_bytes")
_POLICY_BYTES = ("min_headroom_bytes", "min_change_bytes", "granularity_bytes", "noise_margin_bytes")


def scale_samples(samples: Sequence[TelemetrySample], factor: float) -> list[TelemetrySample]:
    out = []
    for s in samples:
        changes = {k: int(getattr(s, k) * factor) for k in _MEMORY_FIELDS if getattr(s, k) is not None}
        out.append(dataclasses.replace(s, **changes))
    return out


def scale_policy(policy: BudgetPolicy, factor: float) -> BudgetPolicy:
    changes = {k: max(1, int(getattr(policy, k) * factor)) for k in _POLICY_BYTES if hasattr(policy, k)}
    return dataclasses.replace(policy, **changes)


def scaled_replay(
    samples: Sequence[TelemetrySample], start_budget_bytes: int, policy: BudgetPolicy | None = None
) -> tuple[list[TelemetrySample], BudgetController]:
    """(scaled samples, a fresh controller with the scaled policy) whose first budget is
    ``start_budget_bytes`` (to within the policy's granularity)."""
    if not samples:
        raise ValueError("no telemetry samples to replay")
    base = policy or DefaultPolicy()
    first = BudgetController(base).update(samples[0])
    if first <= 0:
        raise ValueError("the log's first sample leaves no budget to scale")
    factor = start_budget_bytes / first
    return scale_samples(samples, factor), BudgetController(scale_policy(base, factor))
