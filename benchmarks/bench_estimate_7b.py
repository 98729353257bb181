"""A 7B-class VLM estimated on this machine: wall time and peak RSS (target < 10 s, < 1 GB).

Each model runs in a fresh subprocess so the peak RSS (ru_maxrss) is the estimate's own,
imports included. The child's CPU seconds (user + system) are printed too: the estimate runs on
one thread, so on a machine other jobs share they stand for the wall time it would take alone.

    python benchmarks/bench_estimate_7b.py [--json] [--compare SRC]

``--compare SRC`` runs every case twice, interleaved: first with ``SRC`` (another version's
``src`` folder, e.g. ``git archive HEAD src | tar -x -C /tmp/before``) ahead on ``PYTHONPATH``,
then with this checkout, so a before/after pair sees the same load on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CASES = [
    ("llava-1.5-7b", "--image 336x336 --prompt-tokens 128 --new-tokens 16 --dtype bfloat16"),
    ("qwen2-vl-7b-instruct", "--image 672x672 --prompt-tokens 128 --new-tokens 16 --dtype bfloat16"),
    ("qwen2-audio-7b-instruct", "--audio-seconds 10 --prompt-tokens 128 --new-tokens 16 --dtype bfloat16"),
    # Qwen2-VL's own speed/memory benchmark request: 2048 new tokens cost about what 16 do (issue 15)
    ("qwen2-vl-7b-instruct", "--image 448x448 --prompt-tokens 2 --new-tokens 16 --dtype bfloat16"),
    ("qwen2-vl-7b-instruct", "--image 448x448 --prompt-tokens 2 --new-tokens 2048 --dtype bfloat16"),
]

CHILD = """
import resource, sys, time
t0 = time.perf_counter()
from memwarden.cli import main
code = main(["estimate", *sys.argv[1:], "--json", "--quiet"])
elapsed = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_SELF)
print(f"@@ {elapsed:.3f} {usage.ru_maxrss * 1024} {usage.ru_utime + usage.ru_stime:.3f}", file=sys.stderr)
sys.exit(code)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--compare", default=None, metavar="SRC", help="another version's src folder, run first")
    args = parser.parse_args()
    trees = [("before", os.path.abspath(args.compare)), ("after", None)] if args.compare else [("", None)]
    rows = []
    for model, request in CASES:
        for tree, src in trees:
            env = dict(os.environ)
            if src is not None:
                env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
            proc = subprocess.run(
                [sys.executable, "-c", CHILD, model, *request.split()], capture_output=True, text=True, env=env
            )
            if proc.returncode != 0:
                raise SystemExit(f"{model}: {proc.stderr.strip().splitlines()[-1]}")
            line = next(x for x in proc.stderr.splitlines() if x.startswith("@@ "))
            seconds, rss, cpu = float(line.split()[1]), int(line.split()[2]), float(line.split()[3])
            card = json.loads(proc.stdout)
            rows.append(
                {
                    "tree": tree,
                    "model": model,
                    "request": request,
                    "seconds": seconds,
                    "cpu_seconds": cpu,
                    "peak_rss_bytes": rss,
                    "estimated_peak_bytes": card["peak_bytes"],
                }
            )
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        print(
            f"{r['tree']:6s} {r['model']:26s} {r['seconds']:5.1f} s ({r['cpu_seconds']:4.1f} s CPU)   "
            f"peak RSS {r['peak_rss_bytes'] / 2**20:6.0f} MiB   estimated peak {r['estimated_peak_bytes'] / 2**30:5.1f} GiB   "
            f"({r['request']})"
        )
    for tree, _src in trees:  # 16 and 2048 new tokens: within 1.5x of each other (issue 15)
        short, long = [r for r in rows if r["tree"] == tree][-2:]
        print(
            f"{tree or 'this tree'}: 2048 vs 16 new tokens: {long['cpu_seconds'] / short['cpu_seconds']:.2f}x the CPU seconds"
        )


if __name__ == "__main__":
    main()
