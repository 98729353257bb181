"""Long generations at the cost of a short one: steady-state decode steps, extrapolated.

Two short runs of the same request one decode step apart (``k`` and ``k + 1`` new tokens) give
every event's size as an affine function of the step count. A decode step in steady state makes
the same tensors each time; only those as long as the sequence (keys and values, the attention
mask, the generated ids, attention scores) grow, by the same bytes per token each step. So:

- Regular windows of the longer run (a decode step from its start to the next step's start: the
  forward and generate's bookkeeping) are steady when the last three have the same events
  (action, category, modality, op) and sizes whose second difference is zero. Anything else (a
  sliding window filling up, a quantized cache re-quantizing) is not steady: ``None``, and the
  caller runs every step.
- The final window (the last step and generate's teardown) has the same events in both runs; the
  difference of the two is each event's growth per step.

A window's live bytes at event ``e`` in step ``j`` are ``A_e + B_e * j``; its peak, the max of
those lines, is convex in ``j``, so over all the regular windows not run the peak is at the last
one, which is extrapolated exactly like the final window. The KV cache at the end grows by the
measured bytes per token (exact). Pure: numpy over Traces, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from memwarden.analyze.timeline import breakdown_at, primary_device
from memwarden.trace.model import Category, Trace
from memwarden.trace.steps import steps_of

__all__ = ["Extrapolated", "extrapolate_decode", "kv_at_end"]

_STRUCTURE = ("action", "category", "modality", "op")  # what makes two windows the same events


@dataclass(frozen=True, kw_only=True)
class Extrapolated:
    """The decode phase of a generation of ``new_tokens`` made from two short runs."""

    decode: dict[str, Any]  # peak_bytes, by_category, by_modality (at the decode peak)
    kv_cache_bytes: int  # live KV-cache bytes when generation ends
    measured_new_tokens: int  # the longer of the two runs
    new_tokens: int


def kv_at_end(trace: Trace, device: int) -> int:
    """KV-cache bytes when the last step ends (generate drops the cache when it returns)."""
    if trace.num_events == 0:
        return 0
    kv = np.where(trace.events["category"] == Category.KV_CACHE, trace.signed_bytes(device), 0)
    live_kv = np.cumsum(kv)
    steps = steps_of(trace)
    if not steps:
        return int(live_kv[-1])
    last = int(np.searchsorted(trace.events["time_us"], steps[-1].end_us, side="right")) - 1
    return int(live_kv[last]) if last >= 0 else 0


def _windows(trace: Trace) -> list[tuple[int, int]]:
    """Event index ranges [lo, hi) of each decode step, up to the next step (the last: to the end)."""
    time = trace.events["time_us"]
    starts = [int(np.searchsorted(time, s.start_us, side="left")) for s in steps_of(trace) if s.phase == "decode"]
    return [(lo, hi) for lo, hi in zip(starts, [*starts[1:], trace.num_events], strict=True)]


def _same_events(a: Trace, wa: tuple[int, int], b: Trace, wb: tuple[int, int]) -> bool:
    if wa[1] - wa[0] != wb[1] - wb[0]:
        return False
    return all(np.array_equal(a.events[c][wa[0] : wa[1]], b.events[c][wb[0] : wb[1]]) for c in _STRUCTURE)


def _peak(base: int, sizes: np.ndarray) -> tuple[int, int]:
    """(peak live bytes, event offset) of a window that starts at ``base`` live bytes."""
    live = base + np.cumsum(sizes)
    e = int(np.argmax(live))
    return int(live[e]), e


def _grown(now: dict[str, int], before: dict[str, int], steps: int) -> dict[str, int]:
    keys = dict.fromkeys([*now, *before])
    out = {k: now.get(k, 0) + steps * (now.get(k, 0) - before.get(k, 0)) for k in keys}
    return {k: v for k, v in out.items() if v != 0}


def extrapolate_decode(short: Trace, long: Trace, new_tokens: int) -> Extrapolated | None:
    """The decode phase of ``new_tokens`` from runs of ``k`` (``short``) and ``k + 1`` (``long``) new
    tokens; None when the decode steps are not in steady state."""
    dev = primary_device(long)
    if primary_device(short) != dev:
        return None
    ws, wl = _windows(short), _windows(long)
    if len(wl) != len(ws) + 1 or len(wl) < 4:
        return None
    measured = len(wl) + 1  # new tokens of the longer run: the prefill makes the first
    ahead = new_tokens - measured
    if ahead <= 0:
        return None
    r1, r2, r3 = wl[-4], wl[-3], wl[-2]
    if not (_same_events(long, r1, long, r2) and _same_events(long, r2, long, r3)):
        return None
    if not _same_events(short, ws[-1], long, wl[-1]):
        return None
    sl, ss = long.signed_bytes(dev), short.signed_bytes(dev)
    live_l, live_s = np.cumsum(sl), np.cumsum(ss)
    s1, s2, s3 = (sl[lo:hi] for lo, hi in (r1, r2, r3))
    step = s3 - s2  # each event's growth per decode step
    base1, base2, base3 = (int(live_l[lo - 1]) for lo, _ in (r1, r2, r3))
    base_step = base3 - base2
    if not np.array_equal(s2 - s1, step) or base2 - base1 != base_step:
        return None
    final_l, final_s = sl[wl[-1][0] : wl[-1][1]], ss[ws[-1][0] : ws[-1][1]]
    final_base_l, final_base_s = int(live_l[wl[-1][0] - 1]), int(live_s[ws[-1][0] - 1])
    if final_base_l - final_base_s != base_step:
        return None
    # the last regular window (ahead steps after r3) and the final window (ahead steps after the long run's)
    regular_peak, e_reg = _peak(base3 + ahead * base_step, s3 + ahead * step)
    final_peak, e_fin = _peak(final_base_l + ahead * base_step, final_l + ahead * (final_l - final_s))
    if final_peak >= regular_peak:
        peak, now, before = final_peak, (long, wl[-1][0] + e_fin), (short, ws[-1][0] + e_fin)
    else:
        peak, now, before = regular_peak, (long, r3[0] + e_reg), (long, r2[0] + e_reg)
    measured_decode = _measured_decode_peak(long, wl, live_l)
    if measured_decode[0] > peak:  # an earlier step (the first decode step) stays the highest
        index = measured_decode[1]
        decode = {
            "peak_bytes": measured_decode[0],
            "by_category": breakdown_at(long, index, "category", dev),
            "by_modality": breakdown_at(long, index, "modality", dev),
        }
    else:
        decode = {
            "peak_bytes": peak,
            **{
                f"by_{by}": _grown(
                    breakdown_at(now[0], now[1], by, dev), breakdown_at(before[0], before[1], by, dev), ahead
                )
                for by in ("category", "modality")
            },
        }
    kv_long, kv_short = kv_at_end(long, dev), kv_at_end(short, dev)
    return Extrapolated(
        decode=decode,
        kv_cache_bytes=kv_long + ahead * (kv_long - kv_short),
        measured_new_tokens=measured,
        new_tokens=new_tokens,
    )


def _measured_decode_peak(trace: Trace, windows: list[tuple[int, int]], live: np.ndarray) -> tuple[int, int]:
    """(peak, event index) over the decode windows that were run."""
    lo, hi = windows[0][0], windows[-1][1]
    index = lo + int(np.argmax(live[lo:hi]))
    return int(live[index]), index
