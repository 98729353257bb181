"""``memwarden estimate`` of a shipped 7B config with one image, cold and warm, side by side in one
run (issue 44: targets < 10 s cold, < 3 s warm on this machine).

Cold: no card kept yet, so the meta run builds the model and runs the request (imports of torch and
transformers included). Warm: the same command again, answered from the card kept on disk
(estimation/card_store.py) without importing torch. Each run is the real command in a fresh
process; its wall time and its CPU seconds (user + system: on a machine other jobs share they stand
for the wall time it would take alone) are printed. The native hook's build is shared with this
machine's cache and not counted (the conv probes load it; ``make install`` builds it).

    python benchmarks/bench_estimate_speed.py [--json] [--compare SRC] [--repeat N] [--rounds N]

``--compare SRC`` runs each case first with ``SRC`` (another version's ``src`` folder, e.g.
``git archive HEAD~1 src | tar -x -C /tmp/before``) ahead on ``PYTHONPATH``, cold then warm,
interleaved with this checkout's runs, so a before/after pair sees the same load. ``--rounds N``
runs every case N times over (a fresh store each round: each round's first run is cold); on a
machine other jobs share, the spread of the rounds says how far one pair can be trusted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = [
    ("qwen2-vl-7b-instruct", "--image 1280x720 --prompt-tokens 128 --new-tokens 16"),
    ("llava-1.5-7b", "--image 336x336 --prompt-tokens 128 --new-tokens 16"),
]


def _cache_root(base: Path) -> Path:
    """A fresh store that shares this machine's build of the native hook."""
    native = Path(os.environ.get("MEMWARDEN_CACHE", Path.home() / ".cache" / "memwarden")) / "native"
    root = Path(tempfile.mkdtemp(dir=base))
    if native.is_dir():
        (root / "native").symlink_to(native, target_is_directory=True)
    return root


def _run(model: str, request: str, cache: Path, src: str | None) -> dict[str, float]:
    env = {**os.environ, "MEMWARDEN_CACHE": str(cache)}
    env.pop("MEMWARDEN_ESTIMATE_CACHE", None)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "memwarden", "estimate", model, *request.split(), "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{model}: {proc.stderr.strip().splitlines()[-1]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_bytes": json.loads(proc.stdout)["peak_bytes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--compare", default=None, metavar="SRC", help="another version's src folder (cold only)")
    parser.add_argument("--repeat", type=int, default=1, help="warm runs per case")
    parser.add_argument("--rounds", type=int, default=1, help="times each case is run over, cold first")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # this checkout's sources as they are now: a kept card is keyed by the code, so an edit made
        # while the benchmark runs (a shared working tree) must not turn the warm runs cold
        after = Path(tmp) / "after"
        shutil.copytree(
            Path(__file__).resolve().parents[1] / "src", after, ignore=shutil.ignore_patterns("__pycache__")
        )
        for _round in range(args.rounds):
            for model, request in CASES:
                row: dict[str, object] = {"model": model, "request": request}
                runs = []
                if args.compare:
                    src, before = os.path.abspath(args.compare), _cache_root(Path(tmp))
                    row["before_cold"] = _run(model, request, before, src)
                    row["before_warm"] = [_run(model, request, before, src) for _ in range(args.repeat)]
                    runs += [row["before_cold"], *row["before_warm"]]
                cache = _cache_root(Path(tmp))
                row["cold"] = _run(model, request, cache, str(after))
                row["warm"] = [_run(model, request, cache, str(after)) for _ in range(args.repeat)]
                runs += [row["cold"], *row["warm"]]
                peaks = {r["peak_bytes"] for r in runs}
                if len(peaks) != 1:  # the kept card must be the measured one, and before's the same
                    raise SystemExit(f"{model}: cold, warm and before differ: {sorted(peaks)}")
                rows.append(row)
    if args.json:
        print(json.dumps({"load_average": os.getloadavg(), "rows": rows}, indent=2))
        return
    print(f"load average {os.getloadavg()[0]:.1f}; wall s (CPU s)")
    for row in rows:
        cells = []
        if "before_cold" in row:
            b = row["before_cold"]
            cells.append(f"before cold {b['wall_s']:.1f} ({b['cpu_s']:.1f})")  # type: ignore[index]
            cells += [f"before warm {w['wall_s']:.1f} ({w['cpu_s']:.1f})" for w in row["before_warm"]]  # type: ignore[attr-defined]
        c = row["cold"]
        cells.append(f"cold {c['wall_s']:.1f} ({c['cpu_s']:.1f})")  # type: ignore[index]
        cells += [f"warm {w['wall_s']:.1f} ({w['cpu_s']:.1f})" for w in row["warm"]]  # type: ignore[attr-defined]
        print(f"{row['model']} {row['request']}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
