"""untracked-host-memory: memory the process holds outside torch's allocator.

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

from memwarden.analyze.diagnose import Context, Finding
from memwarden.analyze.lines import lines_of_rows, merge_lines
from memwarden.trace.model import Trace
from memwarden.units import format_bytes

PATTERN = "untracked-host-memory"


def _ints(values: Any, n: int) -> np.ndarray:
    if not isinstance(values, list) or len(values) != n:
        return np.zeros(n, dtype=np.int64)
    return np.array([v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62 else 0 for v in values],
                    dtype=np.int64)  # fmt: skip


def detect(trace: Trace, ctx: Context) -> list[Finding]:
    min_bytes = int(ctx.threshold(PATTERN, "min_bytes", 32 << 20))
    min_share = float(ctx.threshold(PATTERN, "min_share", 0.2))
    resident = trace.metadata.get("resident")
    if not isinstance(resident, dict) or not isinstance(resident.get("samples"), dict):
        return []
    cols = resident["samples"]
    rss = cols.get("rss")
    if not isinstance(rss, list) or len(rss) < 4:
        return []
    n = len(rss)
    rss_a, traced = _ints(rss, n), _ints(cols.get("traced"), n)
    t_us = _ints(cols.get("time_us"), n)
    rest = np.maximum(rss_a - traced, 0)
    # Baseline: the most not-traced memory until the model's first call has returned. Before it the
    # script imports its libraries (transformers alone is tens of MiB of code and objects) and the
    # first call imports what it uses lazily; none of that is the user's data.
    t0 = int(trace.events["time_us"][0]) if trace.num_events else 0
    steps = ctx.analysis.steps
    settled = (steps[0].end_us - t0) if steps else int(t_us[max(1, n // 10) - 1])
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
    lo_t, hi_t = t0 + int(t_us[max(rise - 1, 0)]), t0 + int(t_us[rise])
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
