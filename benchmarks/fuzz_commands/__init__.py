"""The command-level fuzzer behind ``benchmarks/bench_fuzz_commands.py`` (its docstring says what it
does): one module per input kind, each a ``make_*`` that turns a seed and a ``random.Random`` into one
hostile input, and the machinery that runs them.

- ``mutate``: hostile values, canary payloads, tree and byte mutations shared by every kind;
- ``traces``, ``snapshots``, ``configs``, ``thresholds``, ``argv``: the kinds;
- ``child``: one case's forked child (runs ``memwarden.cli.main`` per command, records each run);
- ``runner``: the kinds' state, the driver and the command line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Each case runs in a child forked from the preloaded parent, and GNU OpenMP's thread pool does not
# survive a fork: a child whose parent ran a parallel region hangs in its first one (seen: estimate
# runs stopped at 60 s having used 0.3 s of CPU). One thread, set before torch is first imported.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT / "src", ROOT / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

KINDS = ("trace", "snapshot", "config", "thresholds", "cli")
OVER_BYTES = 2 << 30  # a run past this peak resident set is counted
