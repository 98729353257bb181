"""Run every benchmark in turn (results are copied into docs/benchmarks.md by hand)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
RUNS = [
    ["bench_trace_io.py"],
    ["bench_allocator.py"],
    ["bench_arena.py"],
    ["bench_mobilenet.py"],
    ["bench_diagnose.py"],
    ["bench_estimate_7b.py"],
    ["bench_capture.py", "--repeats", "9", "--threads", "1"],
]

if __name__ == "__main__":
    status = 0
    for args in RUNS:
        print(f"$ python benchmarks/{' '.join(args)}", flush=True)
        status |= subprocess.call([sys.executable, str(HERE / args[0]), *args[1:]])
    sys.exit(status)
