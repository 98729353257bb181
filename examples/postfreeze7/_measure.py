"""Measure a case (files starting with ``_`` are not cases).

``python _measure.py torch CASE.py``: torch CPU peak of the whole run, from the profiler's memory events
(allocations minus frees in time order, the highest running total).
``python _measure.py rss CASE.py``: the maximum resident set size of a fresh process running the case.
"""

from __future__ import annotations

import resource
import runpy
import sys


def torch_peak(path: str) -> int:
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        runpy.run_path(path, run_name="__main__")
    events = []
    for ev in prof.profiler.kineto_results.events():
        if ev.name() == "[memory]" and ev.device_type() == torch.autograd.DeviceType.CPU:
            events.append((ev.start_ns(), ev.nbytes()))
    events.sort()
    cur = peak = 0
    for _, n in events:
        cur += n
        peak = max(peak, cur)
    return peak


def main() -> None:
    mode, path = sys.argv[1], sys.argv[2]
    sys.path.insert(0, path.rsplit("/", 1)[0] if "/" in path else ".")
    if mode == "torch":
        peak = torch_peak(path)
        print(f"PEAK_TORCH {peak / 2**20:.1f} MiB")
    else:
        runpy.run_path(path, run_name="__main__")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(f"PEAK_RSS {rss / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
