"""memwarden diagnose FILE [--json] [--html OUT.html] [--config thresholds.toml] [--budget SIZE]"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from memwarden.errors import InputError


def register(sub: Any) -> None:
    p = sub.add_parser("diagnose", help="name the overflow patterns in a trace, with evidence and a fix")
    p.add_argument("file", help=".mwtrace file or PyTorch memory snapshot pickle")
    p.add_argument("--json", action="store_true", help="print JSON: {peak_bytes, findings: [...]}")
    p.add_argument(
        "--html", metavar="OUT.html", help="also write the HTML report with a findings section (- for stdout)"
    )
    p.add_argument("--config", metavar="TOML", help="thresholds: [thresholds.<pattern-id>] name = value")
    p.add_argument("--pattern", action="append", help="run only this detector (repeatable)")
    p.add_argument(
        "--budget", metavar="SIZE", help="the memory the run must fit in (e.g. 6GiB): a fix that makes it fit is high"
    )
    p.set_defaults(func=run)


# A thresholds file is a few lines; past this it is not one (and is not read into memory).
MAX_CONFIG_BYTES = 1 << 20


def _thresholds(path: str, load: Any) -> dict[str, Any]:
    """``--config``'s tables, every name, type and range checked before the trace is read: one
    InputError otherwise. Only a regular file is opened (a FIFO would block, a device never end)."""
    p = Path(path)
    try:
        if not p.exists():
            raise InputError(f"--config {path}: no such file")
        if not p.is_file():
            raise InputError(f"--config {path}: not a regular file")
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise InputError(f"--config {path}: larger than {MAX_CONFIG_BYTES} bytes; not a thresholds file")
        loaded: dict[str, Any] = load(p)
    except (OSError, ValueError, RecursionError) as exc:  # TOML errors and bad values are ValueErrors
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise InputError(f"--config {path}: {detail[:300]}") from None
    return loaded


def run(args: argparse.Namespace) -> int:
    from memwarden.analyze.diagnose import PATTERNS, load_thresholds, report_json
    from memwarden.commands._common import bytes_option, load_trace, print_json, wrote
    from memwarden.report.full import diagnose_report
    from memwarden.trace.io import check_output

    if args.html:
        check_output(args.html, flag="--html", allow_stdout=not args.json)

    thresholds = _thresholds(args.config, load_thresholds) if args.config else {}
    for pattern in args.pattern or []:
        if pattern not in PATTERNS:
            raise InputError(f"unknown pattern {pattern!r} (known: {', '.join(PATTERNS)})")
    budget = None if args.budget is None else bytes_option("--budget", args.budget)
    trace = load_trace(args.file)
    analysis, findings = diagnose_report(
        trace, args.html or None, thresholds=thresholds, patterns=args.pattern, budget_bytes=budget
    )
    data = report_json(analysis, findings)
    if args.json:
        print_json(data)
        return 0
    from rich.console import Console

    from memwarden.report.findings import render_findings

    if args.html == "-":
        wrote(args.html)
        return 0  # stdout carries the page; the findings are in it
    Console().print(render_findings(findings, data["peak_bytes"]))
    if args.html:
        wrote(args.html)
    return 0
