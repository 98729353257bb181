"""memwarden sweep GRID.toml [--json] [--executor local|ray] [--ray-address ADDR] [--jobs J]"""

from __future__ import annotations

import argparse
import os
from typing import Any

from memwarden.errors import InputError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sweep",
        help="estimate peak memory over models x requests x devices (a TOML grid), locally or on Ray",
        description=(
            "Run `memwarden estimate` for every model x request of GRID (TOML: models, devices, [[requests]]) "
            "through the local process pool or Ray, and print the peak of each point and whether it fits each "
            "device. See examples/sweep/grid.toml."
        ),
    )
    p.add_argument("grid", metavar="GRID", help="grid TOML file")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--executor", default="local", choices=("local", "ray"), help="where estimates run (default local)")
    p.add_argument("--ray-address", default=None, metavar="ADDR", help="join this Ray cluster (default: a local Ray)")
    p.add_argument("--jobs", default=None, metavar="J", help="estimates at once (default: CPU count, at most 4)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.commands._common import print_json
    from memwarden.estimation.sweep import load_grid, render_table, run_sweep
    from memwarden.report.progress import progress
    from memwarden.resilience.executor import make_executor

    default_jobs = min(4, os.cpu_count() or 1)
    try:
        jobs = int(args.jobs) if args.jobs is not None else default_jobs
    except ValueError:
        raise InputError(f"--jobs takes an integer; got {args.jobs!r}") from None
    if not 1 <= jobs <= 1024:
        raise InputError(f"--jobs must be in [1, 1024]; got {jobs}")
    grid = load_grid(args.grid)
    points = len(grid.models) * len(grid.requests)
    label = f"sweep: {points} estimates on {jobs} {'worker' if jobs == 1 else 'workers'}"
    with (
        progress(label, enabled=not (args.json or args.quiet), known_total=False) as step,
        make_executor(args.executor, jobs=jobs, address=args.ray_address) as executor,
    ):
        step(f"{len(grid.models)} models x {len(grid.requests)} requests")
        rows = run_sweep(grid, executor)
    if args.json:
        print_json({"devices": [d.id for d in grid.devices], "rows": rows})
    else:
        print(render_table(grid, rows), end="")
    return 0
