"""What source lines cost per allocation: a tight ``torch.ones(16)`` loop untraced, under
``memwarden.capture(lines=False)``, under ``capture()`` (lines on, the default) and under
``capture(stacks=True)``, interleaved, medians of ``--rounds`` rounds of ``--n`` allocations.

    python benchmarks/bench_lines.py [--rounds 5] [--n 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

import memwarden


def _tight(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        torch.ones(16)
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=20_000)
    args = parser.parse_args()
    modes: dict[str, dict[str, Any] | None] = {
        "untraced": None,
        "lines=False": {"lines": False},
        "lines=True": {},
        "stacks=True": {"stacks": True},
    }
    times: dict[str, list[float]] = {k: [] for k in modes}
    for _ in range(args.rounds):
        for name, kwargs in modes.items():
            if kwargs is None:
                times[name].append(_tight(args.n))
            else:
                with memwarden.capture(**kwargs):
                    times[name].append(_tight(args.n))
    for name, values in times.items():
        print(f"{name:12s} {statistics.median(values) * 1e6:7.2f} µs per allocation")


if __name__ == "__main__":
    main()
