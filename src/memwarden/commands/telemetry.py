"""memwarden telemetry [--replay LOG] [--request BYTES [--kind K]] [--json] [--device PROFILE] [--budget BYTES]
[--policy NAME] [--set K=V]"""

from __future__ import annotations

import argparse
from typing import Any

from memwarden.commands._help import renamed


def register(sub: Any) -> None:
    p = sub.add_parser(
        "telemetry",
        help="live device signals (memory, temperature, power, fps) and the memory budget they imply",
        description=(
            "Read the device's telemetry (NVML, tegrastats, psutil, thermal zones; whichever exist) and "
            "print the signals and the safe memory budget the policy derives from them. With --replay, "
            "play a recorded log (JSON lines or tegrastats text) and print the budget at every sample."
        ),
    )
    p.add_argument("--replay", metavar="LOG", help="a recorded telemetry log to play back instead of live signals")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument(
        "--request",
        metavar="BYTES",
        help="with --replay: does one allocation of BYTES fit the device state the file shows (tegrastats, "
        "/proc/meminfo, free, PSI, mem_get_info, llama.cpp device lines, L4T version, a person's own lines)?",
    )
    p.add_argument(
        "--largest-buffer",
        metavar="BYTES",
        help="with --request: the request's single largest buffer; judged against the largest free contiguous "
        "block (tegrastats lfb, jtop) where the state shows one",
    )
    p.add_argument(
        "--kind",
        choices=("cuda", "host", "mmap", "contiguous"),
        default="cuda",
        help="the allocation --request makes: cuda (device memory; unified on Jetson), host (anonymous), mmap "
        "(file-backed weights), contiguous (physically contiguous buffers) (default: %(default)s)",
    )
    p.add_argument(
        "--device-profile",
        "--device",
        dest="device",
        metavar="PROFILE",
        action=renamed(argparse._StoreAction, "--device", "--device-profile"),
        help="device profile id or TOML: caps the budget at its usable memory",
    )
    p.add_argument("--budget", metavar="BYTES", help="a fixed upper bound on the budget, e.g. 6GiB")
    p.add_argument("--policy", default="default", help="budget policy (default: %(default)s)")
    p.add_argument(
        "--set",
        dest="params",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a policy parameter, e.g. --set min_headroom_bytes=1GiB --set hysteresis_s=10 (repeatable)",
    )
    p.add_argument("--count", type=int, default=1, help="live: number of samples (default: %(default)s)")
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="live: seconds between samples; replay: "
        "seconds between tegrastats lines without timestamps (default: %(default)s)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.commands._common import bytes_option
    from memwarden.errors import InputError
    from memwarden.govern.budget import BudgetController, make_policy

    params: dict[str, str] = {}
    for item in args.params:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set expects KEY=VALUE, got {item!r}")
        params[key.strip()] = value.strip()
    if args.count < 1 or not 0 < args.interval <= 86400:  # inf and NaN fail too: time.sleep(inf) overflows
        raise InputError("--count must be at least 1 and --interval more than 0 and at most 86400 seconds")
    if args.count > 10**9:  # 31 years of samples a second: a number past that is a mistake, not a request
        raise InputError(
            f"--count {str(args.count)[:20]}{'...' if len(str(args.count)) > 20 else ''}: too large (at most 10^9)"
        )
    policy = make_policy(args.policy, params)
    cap = None if args.budget is None else bytes_option("--budget", args.budget)
    if args.device:
        controller = BudgetController.from_device_profile(args.device, policy=policy, cap_bytes=cap)
    else:
        controller = BudgetController(policy, cap_bytes=cap)
    if args.largest_buffer is not None and args.request is None:
        raise InputError("--largest-buffer needs --request BYTES (the whole request it is one buffer of)")
    if args.request is not None and not args.replay:
        raise InputError("--request needs --replay FILE (the device state to judge it against)")
    if args.replay and args.request is not None:
        return _state_verdict(args)
    if args.replay and not _is_own_log(args.replay):  # a paste of other tools' lines: the device state
        return _state_samples(args)
    if args.replay:
        return _replay(args, controller)
    return _live(args, controller)


def _state_verdict(args: argparse.Namespace) -> int:
    from memwarden.commands._common import bytes_option
    from memwarden.errors import InputError
    from memwarden.govern.device_state import judge, load_state
    from memwarden.untrusted import terminal_safe

    request = bytes_option("--request", args.request)
    largest = None
    if args.largest_buffer is not None:
        largest = bytes_option("--largest-buffer", args.largest_buffer)
        if largest > request:
            raise InputError("--largest-buffer is larger than --request (one buffer of the request)")
    read = load_state(args.replay)
    judged = [s for s in read.samples if any(k in s.figures for k in _MEMORY_FIELDS)]
    if not judged:
        raise InputError(
            f"{terminal_safe(args.replay)}: no memory figure in {read.lines} lines ({read.skipped} not recognised)"
        )
    verdict = judge(judged[-1], request, args.kind, largest_buffer_bytes=largest)  # the state now: the last sample
    if args.json:
        from memwarden.commands._common import print_json

        print_json({**verdict.to_json(), "state": read.to_json()})
    else:
        print(f"{verdict.verdict}: {terminal_safe(verdict.reason)}")
        for name, comp in verdict.components.items():
            mark = "*" if comp.counts else " "
            print(
                f" {mark} {name:<22} {comp.bytes / (1 << 20):>12.1f} MiB  line {comp.line_no}: "
                f"{terminal_safe(comp.line)[:60]}"
            )
        print(f"({read.recognised} lines read, {read.skipped} skipped; * = counts for --kind {args.kind})")
    return 0 if verdict.verdict == "fits" else 1


_MEMORY_FIELDS = (
    "mem_available",
    "mem_free",
    "device_free",
    "lfb_block",
    "cma_free",
    "android_free_ram",
    "os_proc_available",
    "jetsam_limit",
)


def _is_own_log(path: str) -> bool:
    """memwarden's own log: JSON lines (the first line an object) or tegrastats lines only. Its
    errors stay its own (a bad rail, a bad timestamp); any other paste is read as device state."""
    import re

    from memwarden.govern.device_state import state_lines

    tegra = re.compile(r"\bRAM \d+/\d+(?:kB|KB|MB|GB)")
    first = True
    for line in state_lines(path):
        if not line.strip():
            continue
        if first and line.lstrip().startswith("{"):
            return True
        first = False
        if tegra.search(line) is None:
            return False
    return True  # empty: the log's own "empty telemetry log" error


def _state_samples(args: argparse.Namespace) -> int:
    from memwarden.errors import InputError
    from memwarden.govern.device_state import load_state, obtainable
    from memwarden.untrusted import terminal_safe

    read = load_state(args.replay)
    samples = [s for s in read.samples if any(k in s.figures for k in _MEMORY_FIELDS)]
    if not samples:
        raise InputError(
            f"{terminal_safe(args.replay)}: neither a telemetry log (JSON lines, tegrastats) nor a "
            f"device state (no memory figure in {read.lines} lines)"
        )
    rows = []
    for sample in samples:
        ob = obtainable(sample, args.kind)
        rows.append(
            {
                "obtainable_bytes": ob.bytes,
                "basis": ob.basis,
                "kind": args.kind,
                "components": {k: c.to_json() for k, c in ob.components.items()},
            }
        )
    if args.json:
        from memwarden.commands._common import print_json

        print_json({"log": args.replay, "state": read.to_json(), "samples": rows})
        return 0
    for i, row in enumerate(rows):
        got = "unknown" if row["obtainable_bytes"] is None else f"{row['obtainable_bytes'] / (1 << 30):.2f} GiB"
        print(f"sample {i}: {args.kind} obtainable {got} ({terminal_safe(row['basis'])})")
    print(f"({read.recognised} lines read, {read.skipped} skipped)")
    return 0


def _replay(args: argparse.Namespace, controller: Any) -> int:
    from memwarden.govern.telemetry_log import load_log

    samples = load_log(args.replay, interval_s=args.interval)
    rows = []
    for sample in samples:
        decision = controller.decide(sample)
        signals = {k: v for k, v in sample.to_json().items() if k != "t"}
        rows.append({**decision.to_json(), **signals})
    budgets = [r["budget_bytes"] for r in rows]
    summary = {
        "samples": len(rows),
        "changes": sum(r["changed"] for r in rows),
        "forced_drops": sum(r["forced"] for r in rows),
        "min_budget_bytes": min(budgets),
        "max_budget_bytes": max(budgets),
    }
    if args.json:
        from memwarden.commands._common import print_json

        print_json(
            {
                "log": args.replay,
                "policy": controller.policy.to_json(),
                "cap_bytes": controller.cap_bytes,
                "samples": rows,
                "summary": summary,
            }
        )
        return 0
    from rich.console import Console

    from memwarden.report.telemetry import budget_table, policy_line, replay_totals_line
    from memwarden.untrusted import markup_safe

    console = Console()
    console.print(policy_line(controller))
    shown = [r for i, r in enumerate(rows) if r["changed"] or i == len(rows) - 1]
    title = f"{markup_safe(args.replay)}: the budget where it changes ({len(rows)} samples)"
    console.print(budget_table(shown, title=title))
    console.print(replay_totals_line(summary))
    return 0


def _live(args: argparse.Namespace, controller: Any) -> int:
    import time

    from memwarden.govern.telemetry import Telemetry

    rows, origin = [], {}
    with Telemetry.detect() as telemetry:
        names = [s.name for s in telemetry.sources]
        for i in range(args.count):
            if i:
                time.sleep(args.interval)
            sample = telemetry.sample()
            decision = controller.decide(sample)
            rows.append({**decision.to_json(), **{k: v for k, v in sample.to_json().items() if k != "t"}})
            origin = dict(telemetry.origin)
        errors = dict(telemetry.errors)
    if args.json:
        from memwarden.commands._common import print_json

        print_json(
            {
                "sources": names,
                "origin": origin,
                "errors": errors,
                "policy": controller.policy.to_json(),
                "cap_bytes": controller.cap_bytes,
                "samples": rows,
            }
        )
        return 0
    from rich.console import Console

    from memwarden.report.telemetry import budget_table, policy_line
    from memwarden.untrusted import markup_safe

    console = Console()
    console.print(f"sources: {markup_safe(', '.join(names) or 'none found')}")
    for name, error in errors.items():  # an exception's text can hold anything, rich markup included
        console.print(f"[yellow]{markup_safe(name)} failed: {markup_safe(error)}[/yellow]")
    console.print(policy_line(controller))
    console.print(budget_table(rows, title="Live telemetry (t from the first sample)", origin=origin, relative_t=True))
    return 0
