"""`memwarden report FILE -o report.html`: a self-contained HTML report of a trace."""

from __future__ import annotations

import argparse
from pathlib import Path

from memwarden.errors import InputError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write a self-contained HTML report of a trace (works offline)",
        description="Write one HTML file with the memory timeline, the breakdown at peak, the top "
        "allocation sites and the module calls of a trace. Every asset is inline; nothing is fetched.",
    )
    parser.add_argument("file", metavar="FILE", help="a .mwtrace file (or a PyTorch memory snapshot, where supported)")
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUT.html",
        default="report.html",
        help="where to write; - for stdout (default: report.html)",
    )
    parser.add_argument("--title", help="page title (default: derived from the trace's model name)")
    parser.add_argument("--no-diagnose", action="store_true", help="leave out the findings section")
    parser.add_argument("--no-heatmap", action="store_true", help="leave out the simulated allocator heatmap")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.commands._common import load_trace, wrote  # load_any when present, else .mwtrace only
    from memwarden.report.full import write_report
    from memwarden.trace.io import check_output

    check_output(args.output, flag="-o")
    trace = load_trace(args.file)
    try:
        written = write_report(
            trace, Path(args.output), title=args.title, diagnose_trace=not args.no_diagnose, heatmap=not args.no_heatmap
        )
    except OSError as exc:
        raise InputError(f"{args.output}: cannot write report ({exc.strerror or exc})") from None
    wrote(args.output if str(written) == "-" else written)
    return 0
