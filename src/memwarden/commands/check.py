"""memwarden check TRACE [--max-peak SIZE] [--max SCOPE=SIZE ...] [--baseline OLD --max-growth 5%]

Exit status: 0 every limit holds, 1 one line per breach on stdout (details on stderr), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from memwarden.errors import InputError

_SCOPES = "a phase, modality or category, or several joined by '.' (prefill.vision)"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="fail (exit 1) when a trace breaks memory limits or grew past a baseline",
        description="Check a trace against memory limits (peak or allocated bytes, for the process or a scope: "
        "a phase, modality or category, or several joined by '.') and, with --baseline, against an older trace "
        "of the same workload, aligned by phase and module path. Exit status: 0 every limit holds, 1 one line per "
        "breach on stdout (the lines and deltas that explain it on stderr), 2 bad input.",
        epilog="example:\n  memwarden check run.mwtrace --max-peak 2GiB --max prefill=1.2GiB --max vision=600MiB\n"
        "  memwarden check run.mwtrace --baseline old.mwtrace --max-growth 5%",
    )
    p.add_argument("file", help=".mwtrace file or PyTorch memory snapshot pickle")
    p.add_argument("--max-peak", metavar="SIZE", help="limit on the process's peak live bytes (2GiB)")
    p.add_argument("--max-allocated", metavar="SIZE", help="limit on the bytes allocated over the whole run")
    p.add_argument(
        "--max",
        action="append",
        default=[],
        metavar="SCOPE=SIZE",
        help=f"limit on a peak: SCOPE is {_SCOPES}; 'allocated:SCOPE=SIZE' limits bytes allocated (repeatable)",
    )
    p.add_argument("--baseline", metavar="OLD.mwtrace", help="compare with this trace of the same workload")
    p.add_argument(
        "--max-growth", metavar="PCT", help="with --baseline: fail when a phase, module or the process grew more"
    )
    p.add_argument(
        "--min-delta", metavar="SIZE", help="with --baseline: ignore growth below this (default 1%% of the old peak)"
    )
    p.add_argument("--json", action="store_true", help="print the outcomes and deltas as JSON")
    p.set_defaults(func=run)


def parse_growth(text: str) -> float:
    """``5%`` or ``5`` (percent) -> 0.05."""
    raw = text.strip().rstrip("%").strip()
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"--max-growth {text!r}: expected a percentage such as 5% or 12.5") from None
    if not 0 <= value < 1e6:
        raise InputError(f"--max-growth {text!r}: out of range (0% or more)")
    return value / 100


def _limits(args: argparse.Namespace) -> list[Any]:
    from memwarden.analyze.check import Limit, parse_limit
    from memwarden.commands._common import bytes_option

    limits = []
    try:
        if args.max_peak is not None:
            limits.append(Limit(max_bytes=bytes_option("--max-peak", args.max_peak)))
        if args.max_allocated is not None:
            limits.append(Limit(max_bytes=bytes_option("--max-allocated", args.max_allocated), measure="allocated"))
        for text in args.max:
            limits.append(parse_limit(text))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return limits


def run(args: argparse.Namespace) -> int:
    from memwarden.analyze.analysis import Analysis
    from memwarden.analyze.baseline import compare_traces, growth_breaches
    from memwarden.analyze.check import check_limits
    from memwarden.commands._common import bytes_option, load_trace, print_json
    from memwarden.report.check import breach_line, explain_outcome, growth_lines, render_deltas

    limits = _limits(args)
    if args.max_growth is not None and args.baseline is None:
        raise InputError("--max-growth needs --baseline OLD.mwtrace")
    growth = parse_growth(args.max_growth) if args.max_growth is not None else None
    if args.baseline is not None and growth is None:
        growth = 0.0  # a baseline without a tolerance: any growth past the noise floor fails
    min_delta = bytes_option("--min-delta", args.min_delta) if args.min_delta is not None else None
    if not limits and args.baseline is None:
        raise InputError("nothing to check: give --max-peak, --max SCOPE=SIZE, --max-allocated or --baseline")
    trace = load_trace(args.file)
    old = load_trace(args.baseline) if args.baseline is not None else None
    analysis = Analysis(trace)
    result = check_limits(trace, limits, analysis=analysis)
    comparison = compare_traces(old, trace) if old is not None else None
    grown = growth_breaches(comparison, growth or 0.0, min_delta) if comparison is not None else []
    failed = bool(result.breaches or grown)
    if args.json:
        print_json(
            {
                "ok": not failed,
                **result.to_json(),
                "growth": [d.to_json() for d in grown],
                "comparison": comparison.to_json() if comparison is not None else None,
            }
        )
        return 1 if failed else 0
    for outcome in result.breaches:
        print(breach_line(outcome))
        for line in explain_outcome(outcome):
            print(line, file=sys.stderr)
    for line in growth_lines(grown, growth or 0.0):
        print(line)
    if comparison is not None and (grown or failed):
        for line in render_deltas(comparison):
            print(line, file=sys.stderr)
    if not failed:
        held = len(result.outcomes) + (1 if comparison is not None else 0)
        print(f"ok: {held} check{'s hold' if held != 1 else ' holds'}")
        for outcome in result.outcomes:
            print(f"  {outcome.message()}")
        if comparison is not None:
            print(f"  no phase, module or process peak grew past +{100 * (growth or 0.0):.1f}% of the baseline")
    return 1 if failed else 0
