"""fragmentation: varying shapes fragment a caching allocator.

PyTorch's CUDA caching allocator keeps freed blocks for reuse instead of
returning them to the device. When request sizes keep changing (random batch
sizes and sequence lengths, a varying number of images or frames), a cached
block rarely fits the next request: larger requests need fresh segments,
smaller ones split cached blocks into odd remainders. Reserved memory then
climbs far above the bytes ever allocated at once, and the process hits OOM
with memory nominally free.

A run whose model calls (prefills and forwards, decode steps aside) all make the same large requests
says nothing: the allocator reuses the first call's blocks for every later one (a reranker scoring
batches of one shape), however much reserved memory rounding leaves unused.

What the trace shows, for a run of at least two model calls (steps) whose large requests come in
more than one size (a shape to bucket; else only the rule without steps applies): the whole run replayed
through the allocator model reserves more than its neediest window (before the first call, a
call, a gap between calls) replayed alone with what was live at its start
(``fragmentation_steps``): ``excess >= min_excess_fraction`` (0.12) of that need and ``>=
min_excess_bytes`` (8 MiB). Calibrated on the real-world corpus and on batch sweeps of variable,
bucketed and fixed lengths (``docs/diagnose-accuracy.md``): every clean run stays at or under
0.10 and 6 MiB, variable lengths are 0.14-0.23 and 10-32 MiB, one fixed shape is 0.

Without steps to compare: the allocation sequence replayed through
``memwarden.plan.allocator.model`` (default settings) reserves much more than it
ever allocates: ``1 - peak_allocated / peak_reserved >= min_overhead_fraction``
(0.3) and ``peak_reserved - peak_allocated >= min_unused_bytes`` (32 MiB).
Reserved memory never shrinks without ``empty_cache()``, so peak reserved
against peak allocated is the cost (the allocator's own "fragmentation at the
reserved peak" is reported too, but it is taken at the moment of the last
segment, often a quiet one).

The same sequence is replayed with ``expandable_segments:True`` and with a
``max_split_size_mb`` chosen from the request sizes; the waste is the default
peak reserved minus the best alternative's. A CPU trace is a prediction of
what the same run does on a CUDA device: such a finding is at most medium (a fifth of reserved
memory saved or more), since the traced run itself stranded nothing.

Cost: the replay is a Python loop (a few microseconds per event, and up to
three replays). Traces with more than ``max_replay_events`` allocator events
(default 50,000) are replayed for the large pool only (requests > 1 MiB: the
pool that holds the big, varying tensors and never shares segments with the
small pool), and past that for the first ``max_replay_events`` of those; the
evidence says which.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from memwarden.analyze.finding import Context, Finding, severity_for
from memwarden.analyze.lines import input_rows, led_by, script_input_lines
from memwarden.analyze.patterns.fragmentation_steps import StepNeed, step_need
from memwarden.analyze.timeline import live_blocks_at
from memwarden.plan.allocator.config import AllocatorConfig
from memwarden.plan.records import ReplayResult
from memwarden.plan.replay import replay
from memwarden.trace.model import Action, Trace
from memwarden.units import format_bytes

PATTERN = "fragmentation"
_MB = 1 << 20
_SMALL_REQUEST_BYTES = 1 << 20  # kSmallSize: requests up to 1 MiB use the small pool
_MIN_MAX_SPLIT_MB = 32  # PyTorch refuses max_split_size_mb <= 20 (kLargeBuffer)


def _replayable(trace: Trace, device: int, max_events: int) -> tuple[Trace, int, str]:
    """The trace (or the part of it) to replay, the device index in it, and what was kept."""
    ev = trace.events
    action = ev["action"]
    is_row = (ev["device"] == device) & (
        (action == Action.ALLOC) | (action == Action.PREEXISTING) | (action == Action.FREE)
    )
    rows = np.flatnonzero(is_row)
    if len(rows) <= max_events:
        return trace, device, f"all {len(rows)} allocator events"
    large = rows[ev["nbytes"][rows] > _SMALL_REQUEST_BYTES]
    scope = f"large pool only: {len(large)} of {len(rows)} allocator events (requests > 1 MiB)"
    if len(large) > max_events:
        scope = f"large pool only, first {max_events} of {len(large)} large-pool events ({len(rows)} in all)"
        large = large[:max_events]
    sub = Trace(
        events={k: v[large] for k, v in ev.items()},
        spans={},
        strings=trace.strings,
        shapes=trace.shapes,
        devices=trace.devices,
        metadata={},
    )
    return sub, device, scope


def _auto_max_split_mb(trace: Trace, device: int) -> int:
    """A power of two (MiB) at or above the median large request: big blocks stay whole."""
    ev = trace.events
    sizes = ev["nbytes"][
        (ev["action"] == Action.ALLOC) & (ev["device"] == device) & (ev["nbytes"] > _SMALL_REQUEST_BYTES)
    ]
    if len(sizes) == 0:
        return _MIN_MAX_SPLIT_MB
    median_mb = float(np.median(sizes)) / _MB
    return int(min(max(2 ** math.ceil(math.log2(max(median_mb, 1.0))), _MIN_MAX_SPLIT_MB), 4096))


def _most_varied(trace: Trace, device: int) -> tuple[str, int]:
    """The module whose large requests come in the most distinct sizes, and that count."""
    ev = trace.events
    rows = np.flatnonzero(
        (ev["action"] == Action.ALLOC) & (ev["device"] == device) & (ev["nbytes"] > _SMALL_REQUEST_BYTES)
    )
    if len(rows) == 0:
        return "(no large requests)", 0
    pairs = np.unique(np.stack([ev["module"][rows].astype(np.int64), ev["nbytes"][rows]]), axis=1)
    modules, counts = np.unique(pairs[0], return_counts=True)
    top = int(np.argmax(counts))
    return trace.string(int(modules[top])) or "(outside modules)", int(counts[top])


def _request_shapes(ctx: Context) -> int:
    """How many different sets of large requests the run's model calls make (decode steps aside: a
    growing cache is kv-concat-growth's): a reranker scoring batches of one shape makes one, a loader
    of random lengths as many as there are lengths. A run without two calls is not judged here (2)."""
    trace, steps = ctx.trace, [s for s in ctx.analysis.steps if s.phase != "decode"]
    if len(steps) < 2:
        return 2
    ev = trace.events
    times = ev["time_us"]
    large = (
        (ev["action"] == Action.ALLOC) & (ev["device"] == ctx.analysis.device) & (ev["nbytes"] > _SMALL_REQUEST_BYTES)
    )
    shapes = set()
    for st in steps:
        lo, hi = np.searchsorted(times, st.start_us, side="left"), np.searchsorted(times, st.end_us, side="right")
        rows = lo + np.flatnonzero(large[lo:hi])
        shapes.add(tuple(sorted(ev["nbytes"][rows].tolist())))
    return len(shapes)


def _summary(result: ReplayResult) -> dict[str, Any]:
    return {
        "peak_reserved_bytes": int(result.peak_reserved_bytes),
        "peak_allocated_bytes": int(result.peak_allocated_bytes),
        "segments_at_peak": int(result.segments_at_peak),
        "largest_free_block_at_peak_bytes": int(result.largest_free_block_at_peak_bytes),
        "fragmentation_at_reserved_peak": round(float(result.fragmentation), 3),
    }


def detect(ctx: Context) -> list[Finding]:
    trace = ctx.trace
    min_overhead = float(ctx.threshold(PATTERN, "min_overhead_fraction", 0.3))
    min_unused = int(ctx.threshold(PATTERN, "min_unused_bytes", 32 * _MB))
    max_events = int(ctx.threshold(PATTERN, "max_replay_events", 50_000))
    if trace.num_events == 0:
        return []
    min_excess = float(ctx.threshold(PATTERN, "min_excess_fraction", 0.12))
    min_excess_bytes = int(ctx.threshold(PATTERN, "min_excess_bytes", 8 * _MB))
    dev = ctx.analysis.device
    sub, sub_dev, scope = _replayable(trace, dev, max_events)
    # The whole trace's default replay is the one the report's heatmap draws: share it.
    base = ctx.analysis.replay() if sub is trace else replay(sub, AllocatorConfig(), device=sub_dev)
    reserved, allocated = base.peak_reserved_bytes, base.peak_allocated_bytes
    if reserved <= 0:
        return []
    overhead = 1.0 - allocated / reserved
    # With steps to compare, the calibrated rule: reserved above what the neediest window needs
    # alone (fragmentation_steps). Without, reserved against allocated at the peaks.
    need = step_need(ctx.analysis, int(ctx.threshold(PATTERN, "max_windows", 8))) if sub is trace else None
    if sub is trace and _request_shapes(ctx) < 2:
        # Every model call made the same large requests: the allocator reuses the first call's blocks
        # for every later one, and nothing changes shape to strand them.
        return []
    module, sizes = _most_varied(sub, sub_dev)
    if sizes < 2:
        # No large request comes in more than one size: no shape to bucket or pad, so reserved above
        # a step's need is not stranded by changing shapes; only a replayed allocator setting can show
        # a saving (the rule without steps).
        need = None
    excess = reserved - need.need_bytes if need is not None else 0
    if need is not None:
        if excess < min_excess * need.need_bytes or excess < min_excess_bytes:
            return []
    elif overhead < min_overhead or reserved - allocated < min_unused:
        return []

    split_mb = int(ctx.threshold(PATTERN, "max_split_size_mb", 0)) or _auto_max_split_mb(sub, sub_dev)
    alternatives = {
        "expandable_segments:True": replay(sub, AllocatorConfig(expandable_segments=True), device=sub_dev),
        f"max_split_size_mb:{split_mb}": replay(
            sub, AllocatorConfig(max_split_size_bytes=split_mb * _MB), device=sub_dev
        ),
    }
    best_conf, best = min(alternatives.items(), key=lambda kv: kv[1].peak_reserved_bytes)
    wasted = int(reserved - best.peak_reserved_bytes)
    if need is not None:
        wasted = max(wasted, int(excess))  # static shapes bring reserved down to the neediest window's
    if wasted <= 0:
        return []

    cpu = not trace.devices[dev].startswith("cuda")
    evidence = {
        **_summary(base),
        "reserved_overhead_fraction": round(overhead, 3),
        "unused_reserved_bytes": int(reserved - allocated),
        "best_alternative": best_conf,
        "alternatives": {conf: _summary(r) for conf, r in alternatives.items()},
        "most_varied_module": module,
        "distinct_large_request_sizes": sizes,
        "note": (
            "a prediction: this CPU trace replayed through a model of the CUDA caching allocator"
            if cpu
            else "replayed through a model of the CUDA caching allocator"
        ),
        "replayed": scope,
        **_step_evidence(need, excess),
        "allocator": "memwarden.plan.allocator (PyTorch caching allocator model), default settings",
    }
    fix = (
        f"set PYTORCH_CUDA_ALLOC_CONF={best_conf} (simulated peak reserved drops from "
        f"{format_bytes(reserved)} to {format_bytes(best.peak_reserved_bytes)}), or bucket batch sizes, sequence "
        f"lengths and image counts to a few fixed shapes so cached blocks are reused: saves {format_bytes(wasted)} "
        f"of reserved memory"
    )
    if need is not None:
        exp = alternatives["expandable_segments:True"].peak_reserved_bytes
        fix = (
            f"the run reserves {format_bytes(reserved)} but its neediest step needs {format_bytes(need.need_bytes)} "
            f"alone: changing shapes ({sizes} request sizes in {module}) strand cached blocks. Pad inputs to one "
            f"static shape (or as few as the replay shows reuse), or set "
            f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (simulated {format_bytes(exp)}; "
            f"{best_conf}: {format_bytes(best.peak_reserved_bytes)}); saves up to {format_bytes(wasted)} of reserved memory"
        )
    return [
        Finding(
            pattern=PATTERN,
            # A CPU trace's saving is a prediction for a CUDA run of the same code, not memory the
            # traced run stranded (the host allocator has no cache of blocks to strand): a hint, low.
            # Held out, medium CPU predictions were right on none of the runs they fired on.
            severity="low" if cpu else severity_for(wasted, reserved),
            bytes_at_peak=int(reserved - allocated),
            wasted_bytes=wasted,
            # reserved memory, which the live-bytes replay does not see: the allocator model's saving
            saving_peak_bytes=wasted,
            predicted=cpu,  # a CUDA run's saving, not the traced peak's: ranked after measured ones
            where=module,
            evidence=evidence,
            fix=fix,
            lines=_shape_lines(trace, ctx, module),
        )
    ]


def _shape_lines(trace: Trace, ctx: Context, where: str) -> list[dict[str, Any]]:
    """The script's lines that made inputs of changing shapes (where a batch is padded to a bucket)
    first, then the lines holding the varied module's bytes at the peak (the calls)."""
    a = ctx.analysis
    sites = {s.call_site for s in a.steps if s.call_site is not None}
    made = script_input_lines(trace, input_rows(trace), sites, varying=True)
    live = live_blocks_at(trace, int(np.argmax(a.live_bytes)), a.device, a.free_index)
    return led_by(made, trace, where, live, PATTERN)


def _step_evidence(need: StepNeed | None, excess: int) -> dict[str, Any]:
    if need is None:
        return {}
    return {
        "neediest_window_reserved_bytes": need.need_bytes,
        "excess_over_neediest_window_bytes": int(excess),
        "excess_fraction": round(excess / need.need_bytes, 3) if need.need_bytes else 0.0,
        "windows": need.windows,
        "windows_replayed": need.replayed,
    }
