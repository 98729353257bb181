"""The kinds' state, the driver (kinds taken in turn) and the command line of ``bench_fuzz_commands.py``."""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fuzz_commands import KINDS, OVER_BYTES
from fuzz_commands.argv import _flags, _write_fixtures, argv_seeds, argv_values, asked_to_run_long, make_argv
from fuzz_commands.child import run_case
from fuzz_commands.configs import make_config, seed_configs
from fuzz_commands.mutate import canary_payloads
from fuzz_commands.snapshots import make_snapshot, seed_snapshots
from fuzz_commands.thresholds import make_thresholds
from fuzz_commands.traces import TRACE_COMMANDS, make_trace, seed_traces


def _preload(kinds: list[str], fix: dict[str, str], work: Path) -> None:
    """Import and warm what the commands use, once, in the parent (children inherit it)."""
    import memwarden.cli
    from memwarden.cli import main

    if (torch := sys.modules.get("torch")) is not None:  # imported before OMP_NUM_THREADS was set (__init__)
        torch.set_num_threads(1)

    # Building the parser imports every command and takes ~20 ms: build it once here. Each case's
    # child gets its own copy with the fork, so nothing a run does to it reaches another case.
    parser = memwarden.cli.build_parser()
    memwarden.cli.build_parser = lambda: parser  # type: ignore[assignment]
    warm = [
        ["summary", fix["trace"]],
        ["diagnose", "--json", fix["trace"]],
        ["report", "-o", "w.html", fix["trace"]],
        ["replay", "--heatmap", "w.png", fix["trace"]],
        ["plan", fix["trace"]],
        ["compare", fix["trace"], fix["pickle"]],
        ["export", "--format", "torch-snapshot", "-o", "w.pickle", fix["trace"]],
    ]
    if "config" in kinds or "cli" in kinds:
        from memwarden.models import zoo

        # every family's modeling and processor modules, imported once here instead of once per case
        for name in zoo.NAMES:
            for media in (["--image", "32x32"], ["--audio-seconds", "1"]):
                warm.append(
                    ["estimate", name, "--no-suggest", "--quiet", "--prompt-tokens", "8", "--new-tokens", "2", *media]
                )
    cwd = os.getcwd()
    os.chdir(work)
    try:
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = io.StringIO()
        try:
            for argv in warm:
                main(argv)
        finally:
            sys.stdout, sys.stderr = saved
    finally:
        os.chdir(cwd)


def _case_maker(kind: str, rng: random.Random, fix: dict[str, str], marker: Path) -> Callable[[Path], list[list[str]]]:
    if kind in ("trace", "snapshot"):
        trace_seeds = seed_traces() if kind == "trace" else []
        snap_seeds = seed_snapshots() if kind == "snapshot" else []
        payloads = canary_payloads(marker)
        name = "case.mwtrace" if kind == "trace" else "case.pickle"

        count = iter(range(1 << 62))

        def make(work: Path) -> list[list[str]]:
            data = make_trace(trace_seeds, rng) if kind == "trace" else make_snapshot(snap_seeds, rng, payloads)
            (work / name).write_bytes(data)
            i = next(count)
            return [[a.format(f=name, seed=fix["trace"]) for a in group[i % len(group)]] for group in TRACE_COMMANDS]

        return make
    if kind == "config":
        configs = seed_configs()

        def make_c(work: Path) -> list[list[str]]:
            data, argv = make_config(configs, rng)
            (work / "config.json").write_bytes(data)
            return [argv]

        return make_c
    if kind == "thresholds":

        def make_t(work: Path) -> list[list[str]]:
            (work / "t.toml").write_bytes(make_thresholds(rng))
            return [
                ["diagnose", "--config", "t.toml", "--json", fix["trace"]],
                ["diagnose", "--config", "t.toml", fix["trace"]],
            ]

        return make_t
    seeds, flags, values = argv_seeds(fix), _flags(), argv_values(fix)

    def make_a(work: Path) -> list[list[str]]:
        return [make_argv(seeds, flags, values, rng)]

    return make_a


class KindRun:
    """The cases of one kind so far: counts, the slowest run, the largest resident set, and the
    first input of each distinct finding (kept under ``keep``)."""

    def __init__(self, kind: str, seed: int, base: Path, fix: dict[str, str], keep: Path) -> None:
        self.kind, self.keep = kind, keep
        self.marker = base / f"canary-{kind}"
        self.work = base / f"{kind}-work"
        self.make = _case_maker(kind, random.Random(f"{kind}:{seed}"), fix, self.marker)
        self.counts = {
            "cases": 0,
            "runs": 0,
            "exit_0": 0,
            "clear_errors": 0,
            "tracebacks": 0,
            "executions": 0,
            "over_time": 0,
            "over_time_cpu": 0,
            "asked_long": 0,
            "over_memory": 0,
            "crashes": 0,
            "bad_json": 0,
        }
        self.findings: dict[str, Any] = {}
        self.max_s, self.max_cpu_s, self.max_rss, self.seconds = 0.0, 0.0, 0, 0.0

    def step(self, timeout_s: float, mem_cap: int) -> None:
        begin = time.perf_counter()
        self.work.mkdir(exist_ok=True)
        for p in self.work.iterdir():
            if p.is_dir() and not p.is_symlink():
                _rmtree(p)
            else:
                p.unlink()
        runs = self.make(self.work)
        self.counts["cases"] += 1
        for rec in run_case(runs, self.work, timeout_s, mem_cap):
            self._record(runs[rec["i"]], rec)
        if self.marker.exists():
            self.counts["executions"] += 1
            self._keep("execution", {"i": 0}, runs[0])
            self.marker.unlink()
        self.seconds += time.perf_counter() - begin

    def _record(self, argv: list[str], rec: dict[str, Any]) -> None:
        counts = self.counts
        counts["runs"] += 1
        self.max_s = max(self.max_s, float(rec.get("s", 0)))
        self.max_cpu_s = max(self.max_cpu_s, float(rec.get("cpu_s", 0)))
        self.max_rss = max(self.max_rss, int(rec.get("rss", 0)))
        problem = None
        if rec.get("timeout"):
            key = "asked_long" if asked_to_run_long(argv) else "over_time"
            counts[key] += 1
            if key == "over_time" and float(rec.get("cpu_s", 0)) >= float(rec.get("s", 0)) * 0.9:
                counts["over_time_cpu"] += 1  # it had the CPU for (nearly) all of it: slow on any machine
            problem = key
        elif rec.get("crash"):
            counts["crashes"] += 1
            problem = "crash"
        elif "exc" in rec or "stderr_tb" in rec:
            counts["tracebacks"] += 1
            problem = "traceback"
        elif rec.get("rc") == 0:
            counts["exit_0"] += 1
        else:
            counts["clear_errors"] += 1
        if rec.get("bad_json"):
            counts["bad_json"] += 1
            problem = problem or "bad json: " + rec["bad_json"]
        if int(rec.get("rss", 0)) > OVER_BYTES:
            counts["over_memory"] += 1
            problem = problem or "over memory"
        if problem:
            self._keep(problem, rec, argv)

    def _keep(self, problem: str, rec: dict[str, Any], argv: list[str]) -> None:
        sig = f"{problem}: {_where(rec)}"
        if sig in self.findings:
            return
        kept = self.keep / f"{self.kind}-{len(self.findings)}"
        kept.mkdir(parents=True, exist_ok=True)
        for p in self.work.iterdir():
            if p.is_file() and p.stat().st_size < 50 << 20 and not p.name.startswith(("out", "err")):
                (kept / p.name).write_bytes(p.read_bytes())
        (kept / "argv.json").write_text(json.dumps(argv))
        self.findings[sig] = {
            "argv": argv[:12],
            "detail": (rec.get("where") or rec.get("stderr_tb") or "")[-600:],
            "exc": rec.get("exc"),
            "kept": str(kept),
        }

    def result(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            **self.counts,
            "max_run_s": round(self.max_s, 2),
            "max_run_cpu_s": round(self.max_cpu_s, 2),
            "max_rss_mib": round(self.max_rss / 2**20),
            "seconds": round(self.seconds, 1),
            "findings": self.findings,
        }


def fuzz(
    kinds: list[str],
    n: int,
    seed: int,
    timeout_s: float,
    mem_cap: int,
    base: Path,
    fix: dict[str, str],
    keep: Path,
    progress: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """``n`` cases of each kind, taken in turn (one of each, then the next of each), so a run
    stopped early has covered every kind alike."""
    states = [KindRun(kind, seed, base, fix, keep) for kind in kinds]
    for case in range(n):
        for state in states:
            state.step(timeout_s, mem_cap)
        if progress and (case + 1) % 50 == 0:
            progress([s.result() for s in states])
    return [s.result() for s in states]


def _where(rec: dict[str, Any]) -> str:
    text = rec.get("where") or rec.get("stderr_tb") or ""
    frames = [line.strip() for line in text.splitlines() if line.strip().startswith('File "')]
    last = frames[-1] if frames else ""
    return f"{rec.get('exc', '')[:60]} @ {last[-120:]}"


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="cases per kind")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--mem-cap-gib", type=float, default=6.0, help="RLIMIT_AS of each case's process")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", help="also write the results (updated as they come) to this JSON file")
    parser.add_argument(
        "--keep",
        default=str(Path(tempfile.gettempdir()) / "memwarden-fuzzcmd-findings"),
        help="folder that keeps the inputs of each distinct finding",
    )
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown kinds {sorted(unknown)}")
    with tempfile.TemporaryDirectory(prefix="memwarden-fuzzcmd-") as tmp:
        base = Path(tmp)
        (base / "fixtures").mkdir()
        fix = _write_fixtures(base / "fixtures")
        _preload(kinds, fix, base)

        def save(partial: list[dict[str, Any]]) -> None:
            if args.out:
                Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "results": partial}, indent=1))

        results = fuzz(
            kinds, args.n, args.seed, args.timeout_s, int(args.mem_cap_gib * 2**30), base, fix, Path(args.keep), save
        )
        save(results)
        for result in [] if args.json else results:
            print(
                f"{result['kind']:10s} {result['cases']:6d} cases {result['runs']:7d} runs  {result['clear_errors']:6d} "
                f"clear errors  {result['exit_0']:6d} ok  {result['tracebacks']} tracebacks  {result['executions']} "
                f"executions  {result['over_time']} over {args.timeout_s:g} s  {result['over_memory']} over 2 GiB  "
                f"{result['crashes']} crashes  {result['bad_json']} bad JSON  max {result['max_run_s']} s "
                f"{result['max_rss_mib']} MiB  {result['seconds']} s",
                flush=True,
            )
            for sig, ex in result["findings"].items():
                print(f"    {sig}\n      argv {ex['argv']}\n      kept {ex['kept']}")
        if args.json:
            print(json.dumps({"results": results}, indent=1))
    bad = ("tracebacks", "executions", "over_time", "over_memory", "crashes", "bad_json")
    return 1 if any(r[k] for r in results for k in bad) else 0
