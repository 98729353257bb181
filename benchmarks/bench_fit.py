"""``memwarden estimate MODEL --fit BUDGET --solve S`` on 7B configs: wall time, CPU time and the
number of estimates the search ran (issue 26: a solve must take under 30 s for a 7B config).

Each case runs in a fresh subprocess through the CLI, so imports count, as a user sees them. The
estimates a solve runs are what the search controls (``fit.estimates_run`` in the card); the cost
of one estimate (the meta run, the real image processor on the solved image size) is the
estimator's. CPU seconds stand for the wall time on an idle machine where other jobs share it.

    python benchmarks/bench_fit.py [--json] [--only SUBSTRING] [--search-from FIT_PY]

``--search-from`` runs another version's ``solve_fit`` on the same estimator, for a before/after
comparison: ``git show REV:src/memwarden/estimation/fit.py > /tmp/fit_before.py``. ``--compare SRC``
runs every case first with another version's whole ``src`` folder ahead on ``PYTHONPATH`` (its
search and its estimator: ``git archive REV src | tar -x -C /tmp/before``), then with this checkout,
interleaved, so both see the same load on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CASES = [
    ("qwen2-vl-7b-instruct", "--fit 17GiB --solve image"),
    ("qwen2-vl-7b-instruct", "--fit 20GiB --solve image"),
    ("qwen2-vl-7b-instruct", "--fit 24GiB --solve image"),  # the context (32768) binds before the budget
    ("qwen2-vl-7b-instruct", "--fit 24GiB --solve prompt-tokens"),
    ("qwen2-vl-7b-instruct", "--image 448x448 --fit 20GiB --solve batch"),
    ("qwen2-vl-7b-instruct", "--image 448x448 --fit 20GiB --solve images"),
    ("qwen2-vl-7b-instruct", "--video 448x448x4 --fit 20GiB --solve frames"),
    ("llava-1.5-7b", "--image 336x336 --fit 16GiB --solve prompt-tokens"),
]

CHILD = """
import importlib.util, os, resource, sys, time
t0 = time.perf_counter()
from memwarden.cli import main
if os.environ.get("BENCH_FIT_SEARCH_FROM"):
    from memwarden.estimation import fit
    spec = importlib.util.spec_from_file_location("fit_before", os.environ["BENCH_FIT_SEARCH_FROM"])
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    fit.solve_fit = before.solve_fit
code = main(["estimate", *sys.argv[1:], "--json", "--quiet"])
elapsed = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_SELF)
print(f"@@ {elapsed:.3f} {usage.ru_utime + usage.ru_stime:.3f}", file=sys.stderr)
sys.exit(code)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", default="", help="run the cases whose model or flags contain this")
    parser.add_argument("--search-from", default=None, metavar="FIT_PY", help="another version's fit.py to run")
    parser.add_argument("--compare", default=None, metavar="SRC", help="another version's src folder, run first")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.search_from:
        env["BENCH_FIT_SEARCH_FROM"] = os.path.abspath(args.search_from)
    trees = [("before", os.path.abspath(args.compare)), ("after", None)] if args.compare else [("", None)]
    rows = []
    for model, request in CASES:
        if args.only and args.only not in f"{model} {request}":
            continue
        for tree, src in trees:
            child_env = dict(env)
            if src is not None:
                child_env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
            proc = subprocess.run(
                [sys.executable, "-c", CHILD, model, *request.split()], capture_output=True, text=True, env=child_env
            )
            if proc.returncode != 0:
                raise SystemExit(f"{model} {request}: {proc.stderr.strip().splitlines()[-1]}")
            line = next(x for x in proc.stderr.splitlines() if x.startswith("@@ "))
            seconds, cpu = float(line.split()[1]), float(line.split()[2])
            fit = json.loads(proc.stdout)["fit"]
            rows.append(
                {
                    "tree": tree,
                    "model": model,
                    "request": request,
                    "seconds": seconds,
                    "cpu_seconds": cpu,
                    "estimates_run": fit["estimates_run"],
                    "value": fit["value"],
                    "next_value": fit["next_value"],
                    "peak_bytes": fit["peak_bytes"],
                    "budget_bytes": fit["budget_bytes"],
                    "next_refused": "next_refused" in fit,
                }
            )
            if not args.json:
                r = rows[-1]
                print(
                    f"{tree:6s} {model:22s} {request:44s} {r['seconds']:6.1f} s ({r['cpu_seconds']:5.1f} s CPU)  "
                    f"{r['estimates_run']:2d} estimates  answer {r['value']} (next {r['next_value']}"
                    f"{', refused' if r['next_refused'] else ''})",
                    flush=True,
                )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
