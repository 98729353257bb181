"""Allocator replays and arena plans as terminal tables (rich). Pure: results in, renderables out."""

from __future__ import annotations

from enum import IntEnum

from rich.table import Table

from memwarden.plan.arena.plan import ArenaPlan
from memwarden.plan.records import ReplayResult
from memwarden.trace.model import Category, Trace
from memwarden.units import format_bytes, format_us

__all__ = ["arena_table", "oom_line", "replay_table"]


def replay_table(result: ReplayResult, *, source: str, device_name: str, trace: Trace | None = None) -> Table:
    """What ``memwarden replay`` prints: the replay's peaks, fragmentation, retries and OOM
    (with ``trace``: when, how big, and where the failing allocation was made)."""
    settings = result.config.to_alloc_conf() or "defaults"
    if result.config.limit_bytes is not None:
        settings += f", limit {format_bytes(result.config.limit_bytes)}"
    table = Table(title=f"{source}: {device_name} through the {result.allocator} allocator model")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("settings", settings if result.allocator != "arena" else "static arena plan")
    table.add_row("peak allocated", format_bytes(result.peak_allocated_bytes))
    table.add_row("peak reserved", format_bytes(result.peak_reserved_bytes))
    table.add_row("fragmentation at reserved peak", f"{result.fragmentation:.1%}")
    table.add_row("reserved but unallocated at peak", format_bytes(result.reserved_unallocated_at_peak_bytes))
    table.add_row("largest free block at peak", format_bytes(result.largest_free_block_at_peak_bytes))
    table.add_row("segments at peak", str(result.segments_at_peak))
    table.add_row("allocation retries (cache flushes)", str(result.num_alloc_retries))
    table.add_row("out of memory", oom_line(result.oom_at_event, trace))
    return table


def oom_line(row: int | None, trace: Trace | None) -> str:
    """``at 1.23 s: 54.0 KiB for model.layers.1.mlp (aten::linear, activation), event 163``."""
    if row is None:
        return "none"
    if trace is None or not 0 <= row < trace.num_events:
        return f"event {row}"
    ev = trace.events

    def col(name: str) -> int:
        return int(ev[name][row])

    module = trace.string(col("module")) or "(no module)"
    op = trace.string(col("op")) or "(unknown op)"
    category = _name(Category, col("category"))
    return f"at {format_us(col('time_us'))}: {format_bytes(col('nbytes'))} for {module} ({op}, {category}), event {row}"


def _name(enum: type[IntEnum], value: int) -> str:
    try:
        return enum(value).name.lower()
    except ValueError:
        return str(value)


def arena_table(plan: ArenaPlan, *, source: str, device_name: str, best_of_all: bool) -> Table:
    """What ``memwarden plan`` prints: the arena against its lower bound and against no sharing.

    ``best_of_all``: the strategy was picked as the smallest of all (``--strategy best``)."""
    table = Table(title=f"{source}: static arena for {device_name}")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("strategy", plan.strategy + (" (best of all)" if best_of_all else ""))
    table.add_row("tensors", str(len(plan.tensor_ids)))
    table.add_row("arena", format_bytes(plan.arena_bytes))
    table.add_row("lower bound (peak live bytes)", format_bytes(plan.lower_bound_bytes))
    over = plan.arena_bytes / plan.lower_bound_bytes - 1 if plan.lower_bound_bytes else 0.0
    table.add_row("above the lower bound", f"{over:.1%}")
    table.add_row("no sharing (sum of all tensors)", format_bytes(plan.naive_bytes))
    return table
