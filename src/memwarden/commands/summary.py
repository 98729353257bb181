"""memwarden summary FILE [--json]"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("summary", help="peak, breakdown at peak, per-phase peaks and weights of a trace")
    p.add_argument("file", help=".mwtrace file or PyTorch memory snapshot pickle")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.analyze.analysis import Analysis
    from memwarden.commands._common import load_trace, print_json

    trace = load_trace(args.file)
    result = Analysis(trace).summary
    if args.json:
        data = result.to_json()
        print_json(data)
        return 0
    from rich.console import Console

    from memwarden.report.console import render_summary

    Console().print(render_summary(result, source=args.file))
    return 0
