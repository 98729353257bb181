"""memwarden stress --a CONFIG_A --b CONFIG_B --runs N [--inject SPEC]... [--seed S] [--json] [--html OUT]
[--executor local|ray] [--ray-address ADDR] [--jobs J]"""

from __future__ import annotations

import argparse
from typing import Any

from memwarden.errors import InputError
from memwarden.resilience.inject import GRAMMAR
from memwarden.trace.io import check_output


def register(sub: Any) -> None:
    p = sub.add_parser(
        "stress",
        help="A/B resilience campaign: serve N requests two ways under the same memory limits and injected faults",
        description=(
            "Run the workload of CONFIG_A and of CONFIG_B (TOML: workload, serving mode, limits) for N requests "
            "each, in worker processes under a real memory limit (RLIMIT_AS) with the injected faults, restart "
            "workers that die, and compare: ok / oom / crash / lost counts, Fisher's exact test on the failure "
            "rates, latency percentiles with bootstrap CIs, recovery time and peak RSS."
        ),
    )
    p.add_argument(
        "--a", required=True, metavar="CONFIG_A", help="campaign config of side A (e.g. examples/stress/plain.toml)"
    )
    p.add_argument("--b", required=True, metavar="CONFIG_B", help="campaign config of side B")
    p.add_argument("--runs", required=True, metavar="N", help="requests per side")
    p.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="SPEC",
        help="fault to inject on both sides (repeatable): " + GRAMMAR.replace("%", "%%"),
    )
    p.add_argument(
        "--sweep",
        default=None,
        metavar="KIND:KEY=LO..HI:POINTS",
        help="run the campaign at each point of one injection parameter and plot both failure-rate curves, "
        "e.g. jitter:size=0..256MiB:5, squeeze:to=100%%..40%%:4, limits:rss=800MiB..500MiB:4",
    )
    p.add_argument("--seed", default="0", metavar="S", help="seed of the request inputs and the bootstrap (default 0)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--records", action="store_true", help="with --json: include every request's record")
    p.add_argument("--html", default=None, metavar="OUT", help="write a self-contained HTML comparison to OUT")
    p.add_argument("--executor", default="local", choices=("local", "ray"), help="where workers run (default local)")
    p.add_argument("--ray-address", default=None, metavar="ADDR", help="join this Ray cluster (default: a local Ray)")
    p.add_argument("--jobs", default="1", metavar="J", help="shards run at once (default 1: latencies stay comparable)")
    p.set_defaults(func=run)


def _int(value: str, flag: str, lo: int, hi: int) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise InputError(f"{flag} takes an integer; got {value!r}") from None
    if not lo <= n <= hi:
        raise InputError(f"{flag} must be in [{lo}, {hi}]; got {n}")
    return n


def run(args: argparse.Namespace) -> int:
    from memwarden.commands._common import print_json, wrote
    from memwarden.resilience.campaign import run_campaign
    from memwarden.resilience.config import load_config
    from memwarden.resilience.executor import make_executor
    from memwarden.resilience.inject import parse_inject

    runs = _int(args.runs, "--runs", 1, 1_000_000)
    seed = _int(args.seed, "--seed", 0, 2**31 - 1)
    jobs = _int(args.jobs, "--jobs", 1, 1024)
    for spec in args.inject:
        parse_inject(spec)
    if args.html:
        check_output(args.html, flag="--html", allow_stdout=not args.json)
    config_a, config_b = load_config(args.a), load_config(args.b)
    if args.sweep is not None:
        return _sweep(args, config_a, config_b, runs=runs, seed=seed, jobs=jobs)
    with make_executor(args.executor, jobs=jobs, address=args.ray_address) as executor:
        result = run_campaign(
            config_a, config_b, runs=runs, inject=args.inject, seed=seed, executor=executor, progress=not args.quiet
        )
    data = result.to_json(records=True)
    if args.html:
        from memwarden.resilience.report import write_stress_html

        try:
            write_stress_html(data, args.html)
        except OSError as exc:
            raise InputError(f"{args.html}: cannot write ({exc.strerror or exc})") from None
    if args.json:
        if not args.records:
            data.pop("records")
        print_json(data)
    elif args.html == "-":
        wrote(args.html)
    else:
        print(_render(data))
        if args.html:
            wrote(args.html)
    return 0


def _render(data: dict[str, Any]) -> str:
    from memwarden.units import format_bytes

    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}s"

    rows: list[tuple[str, ...]] = [("", "A: " + data["a"]["name"], "B: " + data["b"]["name"])]
    for key in ("mode", "requests", "ok", "oom", "crash", "lost", "worker_restarts"):
        rows.append((key, str(data["a"][key]), str(data["b"][key])))
    for key in ("p50_latency_s", "p95_latency_s", "recovery_p50_s"):
        rows.append((key.removesuffix("_s"), s(data["a"][key]), s(data["b"][key])))
    rows.append(("peak_rss_max", *(format_bytes(data[k]["peak_rss_max_bytes"] or 0) for k in ("a", "b"))))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append(f"failure rate: Fisher exact p = {data['failure_rate_p_value']:.4g}")
    if data["outputs_compared"]:
        lines.append(f"answers equal on {data['outputs_equal']}/{data['outputs_compared']} requests ok on both sides")
    return "\n".join(lines)


def _sweep(args: argparse.Namespace, config_a: Any, config_b: Any, *, runs: int, seed: int, jobs: int) -> int:
    from memwarden.commands._common import print_json, wrote
    from memwarden.resilience.executor import make_executor
    from memwarden.resilience.sweep import parse_sweep, run_sweep

    sweep = parse_sweep(args.sweep)
    with make_executor(args.executor, jobs=jobs, address=args.ray_address) as executor:
        data = run_sweep(
            config_a,
            config_b,
            sweep,
            runs=runs,
            inject=args.inject,
            seed=seed,
            executor=executor,
            progress=not args.quiet,
            text=args.sweep,
            records=args.records and args.json,
        )
    if args.html:
        from memwarden.resilience.report import write_sweep_html

        try:
            write_sweep_html(data, args.html)
        except OSError as exc:
            raise InputError(f"{args.html}: cannot write ({exc.strerror or exc})") from None
    if args.json:
        print_json(data)
        return 0
    if args.html == "-":
        wrote(args.html)
        return 0
    print(f"{args.sweep}: A = {data['a_name']}, B = {data['b_name']}, {runs} requests per side and point")
    print(f"{'point':>12}  {'A failed (95% CI)':>24}  {'B failed (95% CI)':>24}")
    for p in data["points"]:
        a, b = p["a"], p["b"]
        print(
            f"{p['label']:>12}  {a['failed']:>3}/{a['requests']:<3} {a['rate']:5.0%} ({a['low']:.0%}-{a['high']:.0%})"
            f"  {b['failed']:>3}/{b['requests']:<3} {b['rate']:5.0%} ({b['low']:.0%}-{b['high']:.0%})"
        )
    if args.html:
        wrote(args.html)
    return 0
