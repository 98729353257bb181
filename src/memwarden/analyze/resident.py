"""Traced against resident memory: what ``memwarden trace``'s resident samples (``metadata.
resident``, every 100 ms) say beside the trace's own bytes.

The difference is memory the trace does not see: native libraries (numpy, BLAS, tokenizers),
allocator caches, the interpreter. It is shown as its own "not traced" line, so a user sees at
once whether the trace explains a kill.
"""

from __future__ import annotations

from typing import Any

__all__ = ["resident_summary"]


def resident_summary(metadata: dict[str, Any]) -> dict[str, Any] | None:
    """``summary --json``'s ``resident``: the resident peak, what the trace held then, the rest
    (not traced), and the sample count; None when the trace has no resident samples."""
    resident = metadata.get("resident")
    if not isinstance(resident, dict):
        return None
    cols = resident.get("samples") or {}
    rss = [int(v) if isinstance(v, int) else 0 for v in cols.get("rss") or []]
    if not rss:
        return None
    traced = [int(v) if isinstance(v, int) else 0 for v in cols.get("traced") or [0] * len(rss)]
    peak = max(range(len(rss)), key=rss.__getitem__)
    traced_at_peak = traced[peak] if peak < len(traced) else 0
    return {
        "peak_rss_bytes": rss[peak],
        "peak_rss_time_us": int((cols.get("time_us") or [0] * len(rss))[peak]),
        "traced_at_rss_peak_bytes": traced_at_peak,
        "not_traced_bytes": max(0, rss[peak] - traced_at_peak),
        "last_rss_bytes": rss[-1],
        "samples": len(rss),
    }
