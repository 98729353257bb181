"""memwarden compare A.mwtrace B.mwtrace [--json | --html [OUT.html]]"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="two traces side by side: peak, per category, modality, phase and module (e.g. PyTorch vs ONNX Runtime)",
    )
    p.add_argument("a", metavar="A", help="first trace (.mwtrace or PyTorch snapshot)")
    p.add_argument("b", metavar="B", help="second trace")
    p.add_argument(
        "--module-depth", type=int, default=4, metavar="N", help="module path components to group by (default 4)"
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument(
        "--html",
        nargs="?",
        const="compare.html",
        metavar="OUT.html",
        help="write an HTML page (default file: compare.html)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.commands._common import load_trace, print_json, wrote
    from memwarden.errors import InputError
    from memwarden.report.compare import compare, describe
    from memwarden.untrusted import markup_safe, terminal_safe

    if not 1 <= args.module_depth <= 64:
        raise InputError("--module-depth must be between 1 and 64")
    if args.html:
        from memwarden.trace.io import check_output

        check_output(args.html, flag="--html", allow_stdout=False)
    a, b = load_trace(args.a), load_trace(args.b)
    result = compare(
        a,
        b,
        a_name=f"{Path(args.a).name}: {describe(a, 'A')}",
        b_name=f"{Path(args.b).name}: {describe(b, 'B')}",
        module_depth=args.module_depth,
    )
    # names come from the traces (module paths, ONNX node names, metadata): untrusted text. The page
    # HTML-escapes them; here every control character is made visible, for the page and the terminal
    result = _shown(result, terminal_safe)
    if args.json:
        print_json(result.to_json())
        return 0
    if args.html:
        from memwarden.report.compare import comparison_html
        from memwarden.trace.io import atomic_write

        atomic_write(args.html, comparison_html(result).encode())
        wrote(args.html, f"{len(result.rows)} rows")
        return 0
    from rich.console import Console

    from memwarden.report.compare import comparison_table

    Console().print(comparison_table(_shown(result, markup_safe)))
    return 0


def _shown(result: Any, safe: Callable[[object], str]) -> Any:
    """``result`` (a ``SideBySide``) with its names and row labels passed through ``safe``."""
    rows = tuple(replace(d, kind=safe(d.kind)[:200], key=safe(d.key)[:300]) for d in result.comparison.deltas)
    return replace(
        result,
        a_name=safe(result.a_name)[:300],
        b_name=safe(result.b_name)[:300],
        comparison=replace(result.comparison, deltas=rows),
    )
