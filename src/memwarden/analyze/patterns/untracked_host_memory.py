"""untracked-host-memory: memory the process holds outside torch's allocator.

Two sources, the first measured block by block:

- **numpy arrays' data.** ``memwarden trace`` is numpy's data-memory handler while it records
  (``metadata.numpy_recorded``): every numpy block of 4 KiB or more is a row of the trace, op
  ``(numpy)``, at the user's line that made it. The pattern holds when one line's numpy blocks live
  at the peak number at least ``min_blocks`` (4: a collection — decoded frames, a preprocessed
  dataset — not one waveform the model reads) and hold at least ``min_bytes`` (16 MiB) and
  ``min_share`` (0.2) of the peak. The fix streams them: each block is freed when the next one of
  its line is made, and the replay of that gives the saving. The line is the script's statement
  that asked for them (up through helpers: a frame decoder, ``return decode(...)``) and keeps them.
- **everything else** (PIL images, a C library's buffers), from the resident samples below.

Decoded video frames kept as numpy arrays, PIL images, a processor's numpy buffers, a dataset read
whole into memory: none of it passes through torch's allocator, so a trace of tensors alone says
the run peaked at 300 MiB while the kernel killed it at 2 GiB. ``memwarden trace`` samples the
process's resident memory beside the trace (``metadata.resident``: RSS and the trace's own bytes
every 100 ms); what the trace does not hold is the rest.

What the trace shows: the resident bytes not traced, against the most they were until the
model's first call returned (the interpreter, torch and the libraries the script and that call
import). Memory held outside torch before the first call (frames decoded before the model ever
runs) is part of that baseline and not seen: a limit of telling data from code by RSS alone. The pattern holds when that rest grows by at least ``min_bytes`` (32 MiB) and by at
least ``min_share`` (0.2) of the trace's own peak.

The fix is the user's (stream frames instead of decoding the whole video, drop the numpy copy once
it is a tensor, ``del`` PIL images): the saving at the resident peak is the growth live there. The
line is the user's line that allocated nearest before the growth (the ``torch.from_numpy`` of the
frames, the processor call), when the trace has one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding
from memwarden.analyze.lines import LineBytes, lines_of_rows, merge_lines
from memwarden.analyze.source_lines import holding_line, script_files
from memwarden.trace.model import Action, Category, Trace
from memwarden.trace.sites import parse_line
from memwarden.units import format_bytes

PATTERN = "untracked-host-memory"
NUMPY_OP = "(numpy)"  # the op of numpy's data blocks in a live trace (record/native.cpp)


def _ints(values: Any, n: int) -> np.ndarray:
    if not isinstance(values, list) or len(values) != n:
        return np.zeros(n, dtype=np.int64)
    return np.array(
        [v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62 else 0 for v in values], dtype=np.int64
    )


def detect(ctx: Context) -> list[Finding]:
    trace = ctx.trace
    return (
        _numpy_held(trace, ctx) or _numpy_whole(trace, ctx) or _copied_out(trace, ctx) or _resident_growth(trace, ctx)
    )


def _numpy_held(trace: Trace, ctx: Context) -> list[Finding]:
    """numpy blocks of one user line live at the peak, many of them: the data a script holds."""
    min_bytes = int(ctx.threshold(PATTERN, "min_bytes", 16 << 20))
    min_share = float(ctx.threshold(PATTERN, "min_share", 0.2))
    min_blocks = int(ctx.threshold(PATTERN, "min_blocks", 4))
    if NUMPY_OP not in trace.strings or not trace.num_events:
        return []
    e = trace.events
    live = ctx.analysis.live_bytes
    peak_row = int(np.argmax(live))
    peak = int(live[peak_row])
    free = ctx.analysis.free_index
    rows = np.flatnonzero(
        (e["op"] == trace.strings.index(NUMPY_OP))
        & (e["action"] == Action.ALLOC)
        & (e["device"] == ctx.analysis.device)
        & (e["line"] >= 0)
    )
    rows = rows[(rows <= peak_row) & (free[rows] > peak_row)]
    if not len(rows):
        return []
    keys, inverse = np.unique(e["line"][rows], return_inverse=True)
    held = np.bincount(inverse, weights=e["nbytes"][rows].astype(np.float64))
    counts = np.bincount(inverse)
    k = int(np.argmax(np.where(counts >= min_blocks, held, -1)))
    group, nbytes = rows[inverse == k], int(held[k])
    if counts[k] < min_blocks or nbytes < min_bytes or nbytes < min_share * max(peak, 1):
        return []
    # Streamed: every block of the line (made up to the peak) freed when the next one is made.
    made = np.flatnonzero((e["line"] == keys[k]) & (e["op"] == e["op"][group[0]]) & (e["action"] == Action.ALLOC))
    made = made[made <= peak_row]
    next_made = made[1:]
    sooner = free[made[:-1]] > next_made
    change = Change(free_rows=made[:-1][sooner], free_at=next_made[sooner])
    site = parse_line(trace.strings[int(keys[k])])
    scripts = script_files([s.call_site or "" for s in ctx.analysis.steps]) or [site.file]
    holder = holding_line(site.file, site.line, site.function, scripts)
    lines = [LineBytes(holder.file, holder.line, holder.what, nbytes, 0)] if holder is not None else []
    lines.append(LineBytes(site.file, site.line, site.function, nbytes, int(counts[k])))
    where = "numpy arrays"
    fix = (
        f"{int(counts[k])} numpy arrays ({format_bytes(nbytes)}: decoded frames, images, a preprocessed dataset) "
        f"made at {site.file}:{site.line} are all held at the peak, outside torch: decode or load only what "
        f"the model reads (sample frame indices before decoding, e.g. decord's get_batch), or load them lazily, "
        f"one batch at a time (a generator that yields each batch instead of a list of all of them), and del "
        f"each once it is a tensor"
    )
    evidence: dict[str, Any] = {
        "numpy_blocks_at_peak": int(counts[k]),
        "numpy_bytes_at_peak": nbytes,
        "peak_bytes": peak,
        "made_at": f"{site.file}:{site.line}",
    }
    return [
        Finding(
            pattern=PATTERN,
            severity="high",
            bytes_at_peak=nbytes,
            wasted_bytes=nbytes,
            where=where,
            evidence=evidence,
            fix=fix,
            lines=merge_lines(lines),
            change=change,
        )
    ]


def _numpy_whole(trace: Trace, ctx: Context) -> list[Finding]:
    """The peak is data read whole in numpy while the model reads it in pieces: numpy blocks made
    outside every model call hold most of the trace's peak (``min_numpy_share``, 0.5) and at least
    ``min_whole_bytes`` (64 MiB), and the
    largest is at least ``min_pieces`` (4) times the largest input a model call was given (a whole
    episode decoded, then cut into 30 s windows; a video decoded, then sampled). The fix reads the
    pieces as they are used (a generator over the decoder's blocks): the replay drops every numpy
    block made outside the calls that is as large as ``min_pieces`` model inputs."""
    # A recording or a video held whole is the usual pipeline while it is small (two minutes of
    # 16 kHz audio are 8 MiB of float32): it is the mistake once it is a device's worth of memory.
    min_bytes = int(ctx.threshold(PATTERN, "min_whole_bytes", 64 << 20))
    min_numpy_share = float(ctx.threshold(PATTERN, "min_numpy_share", 0.5))
    min_pieces = float(ctx.threshold(PATTERN, "min_pieces", 4))
    steps = ctx.analysis.steps
    if NUMPY_OP not in trace.strings or not trace.num_events or not steps:
        return []
    e = trace.events
    live = ctx.analysis.live_bytes
    peak_row = int(np.argmax(live))
    peak = int(live[peak_row])
    free = ctx.analysis.free_index
    made = np.flatnonzero((e["op"] == trace.strings.index(NUMPY_OP)) & (e["action"] == Action.ALLOC) & (e["line"] >= 0))
    t = e["time_us"][made]
    inside = np.zeros(len(made), dtype=bool)
    for s in steps:
        inside |= (t >= s.start_us) & (t <= s.end_us)
    made = made[~inside]
    rows = made[(made <= peak_row) & (free[made] > peak_row)]
    nbytes = int(e["nbytes"][rows].sum())
    if not len(rows) or nbytes < min_bytes or nbytes < min_numpy_share * max(peak, 1):
        return []
    inputs = np.flatnonzero((e["category"] == Category.INPUT) & (e["action"] == Action.ALLOC))
    read = int(e["nbytes"][inputs].max()) if len(inputs) else 0
    largest = int(e["nbytes"][rows].max())
    if read <= 0 or largest < min_pieces * read:
        return []
    big = rows[np.argmax(e["nbytes"][rows])]
    site = parse_line(trace.strings[int(e["line"][big])])
    scripts = script_files([s.call_site or "" for s in steps]) or [site.file]
    holder = holding_line(site.file, site.line, site.function, scripts)
    lines = [LineBytes(holder.file, holder.line, holder.what, nbytes, 0)] if holder is not None else []
    lines.append(LineBytes(site.file, site.line, site.function, largest, 1))
    fix = (
        f"{format_bytes(nbytes)} of numpy arrays made outside the model's calls are most of the peak "
        f"({len(rows)} arrays, the largest {format_bytes(largest)} made at {site.file}:{site.line}), while each "
        f"model call reads at most {format_bytes(read)}: the data is decoded or read whole and used in pieces. "
        f"Stream it: read or decode one chunk (block, window, batch of frames) at a time with a generator and "
        f"convert each as it is used, instead of decoding everything first"
    )
    evidence: dict[str, Any] = {
        "numpy_blocks_at_peak": len(rows),
        "numpy_bytes_at_peak": nbytes,
        "largest_numpy_bytes": largest,
        "largest_model_input_bytes": read,
        "peak_bytes": peak,
        "made_at": f"{site.file}:{site.line}",
    }
    return [
        Finding(
            pattern=PATTERN,
            severity="high",
            bytes_at_peak=nbytes,
            wasted_bytes=nbytes,
            where="numpy arrays",
            evidence=evidence,
            fix=fix,
            lines=merge_lines(lines),
            # streamed, no whole-data array is made: each one the size of several model inputs goes
            change=Change(drop=made[e["nbytes"][made] >= min_pieces * read]),
        )
    ]


def _resident_rest(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The resident samples: (time_us, RSS, the resident bytes the trace does not hold)."""
    resident = trace.metadata.get("resident")
    if not isinstance(resident, dict) or not isinstance(resident.get("samples"), dict):
        return None
    cols = resident["samples"]
    rss = cols.get("rss")
    if not isinstance(rss, list) or len(rss) < 4:
        return None
    n = len(rss)
    rss_a, traced = _ints(rss, n), _ints(cols.get("traced"), n)
    # Freed tensors' memory stays resident (glibc keeps freed heap chunks), so what the trace does
    # not hold is measured against the most it has held so far, not what it holds now.
    return _ints(cols.get("time_us"), n), rss_a, np.maximum(rss_a - np.maximum.accumulate(traced), 0)


def _copied_out(trace: Trace, ctx: Context) -> list[Finding]:
    """Data that passed through numpy into memory the trace cannot see: one user line's numpy
    blocks, each made and freed (a page rendered, a frame decoded, then handed to PIL or a C
    library that copies it), while the resident memory not traced rose by about as much as they
    held and stayed up to the resident peak: the copies (a list of PIL images) are what the script
    keeps. Unlike ``_resident_growth`` this needs no baseline after the model's first call, so data
    read whole before the model ever runs is seen; the numpy blocks tell it from imported code."""
    min_bytes = int(ctx.threshold(PATTERN, "min_bytes", 32 << 20))
    min_share = float(ctx.threshold(PATTERN, "min_share", 0.2))
    samples = _resident_rest(trace)
    if samples is None or NUMPY_OP not in trace.strings or not trace.num_events:
        return []
    t_us, rss, rest = samples
    e = trace.events
    free = ctx.analysis.free_index
    made = np.flatnonzero((e["op"] == trace.strings.index(NUMPY_OP)) & (e["action"] == Action.ALLOC) & (e["line"] >= 0))
    if not len(made):
        return []
    peak_sample = int(np.argmax(rss))
    trace_peak = max(ctx.summary.peak_bytes, 1)
    best: tuple[int, int, np.ndarray] | None = None  # (held, rise, the line's rows)
    # One stretch of one line: its blocks between two model calls (a list made before the model
    # runs), not a line that makes a little for every request over the whole run.
    starts = np.array(sorted(s.start_us for s in ctx.analysis.steps), dtype=np.int64)
    stretch = np.searchsorted(starts, e["time_us"][made], side="right")
    keys = np.stack([e["line"][made].astype(np.int64), stretch.astype(np.int64)], axis=1)
    _, group = np.unique(keys, axis=0, return_inverse=True)
    group = group.reshape(-1)
    total = np.bincount(group, weights=e["nbytes"][made].astype(np.float64))
    order = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[order], np.arange(len(total) + 1))
    for g in np.flatnonzero(total >= min_bytes).tolist():  # each group's rows once, in time order
        rows = made[order[bounds[g] : bounds[g + 1]]]
        t0, t1 = int(e["time_us"][rows[0]]), int(e["time_us"][rows[-1]])
        before = int(np.searchsorted(t_us, t0, side="left")) - 1
        after = int(np.searchsorted(t_us, t1, side="right"))
        if before < 0 or after >= len(t_us) or peak_sample < after:
            continue
        rise = int(rest[after]) - int(rest[before])
        held = int(rest[peak_sample]) - int(rest[before])
        # the line's blocks themselves freed by then: what rose is a copy, not the numpy data
        still = int(e["nbytes"][rows[free[rows] > rows[-1]]].sum())
        if (
            rise < min_bytes
            or rise < min_share * trace_peak
            or held < 0.5 * rise
            or int(e["nbytes"][rows].sum()) < 0.5 * rise
            or still >= 0.5 * rise
        ):
            continue
        if best is None or held > best[0]:
            best = (held, rise, rows)
    if best is None:
        return []
    held, rise, rows = best
    site = parse_line(trace.strings[int(e["line"][rows[0]])])
    scripts = script_files([s.call_site or "" for s in ctx.analysis.steps]) or [site.file]
    holder = holding_line(site.file, site.line, site.function, scripts)
    lines = [LineBytes(holder.file, holder.line, holder.what, held, 0)] if holder is not None else []
    lines.append(LineBytes(site.file, site.line, site.function, int(e["nbytes"][rows].sum()), len(rows)))
    fix = (
        f"{len(rows)} numpy arrays made at {site.file}:{site.line} were copied out of numpy (PIL images, a C "
        f"library's buffers) and kept: resident memory outside torch rose {format_bytes(rise)} while they were made "
        f"and still holds {format_bytes(held)} at the resident peak. Produce them one at a time as they are used "
        f"(a generator; for PDF pages convert_from_path(first_page=i, last_page=i) or paths_only=True; for video, "
        f"decode the sampled frames only) and del each once it is a tensor"
    )
    evidence: dict[str, Any] = {
        "numpy_blocks": len(rows),
        "numpy_bytes_allocated": int(e["nbytes"][rows].sum()),
        "not_traced_rise_bytes": rise,
        "not_traced_held_at_rss_peak_bytes": held,
        "rss_peak_bytes": int(rss[peak_sample]),
        "trace_peak_bytes": ctx.summary.peak_bytes,
        "made_at": f"{site.file}:{site.line}",
    }
    return [
        Finding(
            pattern=PATTERN,
            severity="high",
            bytes_at_peak=held,
            wasted_bytes=held,
            where="outside torch",
            evidence=evidence,
            fix=fix,
            lines=merge_lines(lines),
            saving_peak_bytes=held,
        )
    ]


def _resident_growth(trace: Trace, ctx: Context) -> list[Finding]:
    min_bytes = int(ctx.threshold(PATTERN, "min_bytes", 32 << 20))
    min_share = float(ctx.threshold(PATTERN, "min_share", 0.2))
    samples = _resident_rest(trace)
    if samples is None:
        return []
    t_us, rss_a, rest = samples
    n = len(t_us)
    # Baseline: the most not-traced memory until the model's first call has returned. Before it the
    # script imports its libraries (transformers alone is tens of MiB of code and objects) and the
    # first call imports what it uses lazily; none of that is the user's data.
    # The samples and the steps share the trace's clock, whose zero is the capture's start: under
    # ``memwarden trace`` the first event comes seconds later (the script's imports), and measuring
    # from it would end the baseline before the call and credit the imports to the user's data.
    steps = ctx.analysis.steps
    # Without model calls, the imports end where the run's first block is made.
    first = int(trace.events["time_us"].min()) if trace.num_events else int(t_us[max(1, n // 10) - 1])
    settled = steps[0].end_us if steps else first
    head = max(1, int(np.searchsorted(t_us, settled, side="right")))
    if head >= n:
        return []
    baseline = int(rest[:head].max())
    growth = rest - baseline
    peak_sample = int(np.argmax(rss_a))
    at_peak = int(max(growth[peak_sample], 0))
    most = int(growth.max())
    trace_peak = ctx.summary.peak_bytes
    if most < min_bytes or most < min_share * max(trace_peak, 1) or most < baseline:
        return []
    # Held, not churned: freed numpy buffers often stay resident (glibc keeps freed chunks once its
    # mmap threshold has grown), so a level that rises and then plateaus is the C allocator's cache.
    # Data kept per request keeps rising to the end: the last third must add a quarter of the growth.
    two_thirds = head + (n - head) * 2 // 3
    if int(rest[-1]) - int(rest[min(two_thirds, n - 1)]) < 0.25 * most:
        return []
    rise = int(np.argmax(growth >= 0.5 * most))  # the first sample past half of the growth
    lo_t, hi_t = int(t_us[max(rise - 1, 0)]), int(t_us[rise])
    e = trace.events
    rows = np.flatnonzero((e["time_us"] <= hi_t) & (e["line"] >= 0) & (e["action"] == 0))
    near = rows[e["time_us"][rows] >= lo_t]
    made = lines_of_rows(trace, near if len(near) else rows[-1:], limit=2)
    evidence: dict[str, Any] = {
        "not_traced_growth_bytes": most,
        "not_traced_growth_at_rss_peak_bytes": at_peak,
        "not_traced_baseline_bytes": baseline,
        "rss_peak_bytes": int(rss_a[peak_sample]),
        "trace_peak_bytes": trace_peak,
        "growth_at_us": int(t_us[rise]),
    }
    where = f"{made[0].file}:{made[0].line}" if made else "outside torch"
    fix = (
        f"{format_bytes(most)} of resident memory is held outside torch (numpy arrays, decoded video frames, PIL "
        f"images, a processor's buffers) from about {where}: stream or sample frames instead of decoding them all, "
        f"convert with torch.from_numpy and del the numpy copy, free PIL images after preprocessing"
    )
    return [
        Finding(
            pattern=PATTERN,
            severity="high",
            bytes_at_peak=at_peak,
            wasted_bytes=most,
            where=where,
            evidence=evidence,
            fix=fix,
            lines=merge_lines(made),
            saving_peak_bytes=at_peak,
        )
    ]
