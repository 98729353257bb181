"""memwarden demo: capture, summarise and report the built-in deployment."""

from __future__ import annotations

import argparse
from typing import Any

from memwarden.errors import InputError


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the built-in deployment (a small VLM chatting about an image) and report it")
    p.add_argument("-o", "--out-dir", default=".", help="where report.html and demo.mwtrace go (default: .)")
    p.add_argument("--model", default=None, help="zoo model (default: the built-in deployment, llava)")
    p.add_argument("--size", default="small", choices=["tiny", "small"], help="zoo size (default: small)")
    p.add_argument("--turns", type=int, default=None, help="chat turns (default: 4)")
    p.add_argument(
        "--budget",
        default=None,
        help="device budget, e.g. 320MiB (default: 196MiB for the built-in deployment, where plain "
        "generate() fails under the real limit and the GovernedSession answers; 320MiB otherwise)",
    )
    p.add_argument("--naive-only", action="store_true", help="skip the GovernedSession part (before only)")
    p.add_argument(
        "--real-limit",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run plain generate() and the GovernedSession in child processes under a real "
        "address-space limit of the budget, and show which one fails (default: on)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.runtime.admission import AdmissionError
    from memwarden.runtime.session_owned import BudgetError

    try:
        return _run(args)
    except (AdmissionError, BudgetError) as exc:  # a budget the deployment cannot be served in: one line, no traceback
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(
            f"--budget {args.budget or 'default'}: the GovernedSession cannot serve the demo: {first}"
        ) from None


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memwarden.commands._common import bytes_option
    from memwarden.demo import run_demo, verdict
    from memwarden.models.chat import DEMO_DEVICE_BUDGET_BYTES, DEMO_TURNS, DemoConfig

    out = Path(args.out_dir)
    if not out.is_dir():
        raise InputError(f"{args.out_dir}: not a directory")
    built_in = not args.model and args.size == "small"
    turns = args.turns if args.turns is not None else DEMO_TURNS
    if turns < 1:
        raise InputError("--turns must be at least 1")
    kwargs: dict[str, Any] = {"size": args.size, "turns": turns, "governed": not args.naive_only}
    if args.model:
        from memwarden.models import zoo

        zoo.spec(args.model)  # unknown names fail here with the list of valid ones
        kwargs["model"] = args.model
    if args.budget is None and built_in:
        kwargs["budget_bytes"] = DEMO_DEVICE_BUDGET_BYTES
    if args.budget:
        kwargs["budget_bytes"] = bytes_option("--budget", args.budget)
    config = DemoConfig(**kwargs)

    if args.json:
        from memwarden.commands._common import print_json

        result = run_demo(config, out, real_limit=args.real_limit and not args.naive_only)
        doc = {
            "summary": result.summary.to_json(),
            "fits_budget": result.fits,
            "budget_bytes": config.budget_bytes,
            "findings": [f.to_json() for f in result.findings],
            "report": str(result.report_path),
            "trace": str(result.trace_path),
        }
        if result.governed is not None:
            g = result.governed
            doc["governed"] = {
                "summary": g.summary.to_json(),
                "fits_budget": g.summary.peak_bytes <= config.budget_bytes,
                "findings": [f.to_json() for f in g.findings],
                "outputs_equal": g.outputs_equal,
                "stats": g.stats,
                "report": str(g.report_path),
                "trace": str(g.trace_path),
            }
        if result.thermal is not None:
            th = result.thermal
            doc["thermal"] = {
                "log": th.log,
                "requests": th.requests,
                "failed": th.failed,
                "outputs_equal": th.outputs_equal,
                "start_budget_bytes": th.start_budget_bytes,
                "min_budget_bytes": th.min_budget_bytes,
                "end_budget_bytes": th.end_budget_bytes,
                "budget_violations": th.check.violations,
                "worst_over_bytes": th.check.worst_over_bytes,
                "decisions": th.decisions,
            }
        if result.limited is not None:
            import dataclasses

            doc["real_limit"] = {**dataclasses.asdict(result.limited), "story": result.limited.story}
        print_json(doc)
        return 0

    from rich.console import Console

    from memwarden.report.console import render_summary
    from memwarden.report.progress import progress

    with progress("memwarden demo", enabled=not args.quiet) as step:
        result = run_demo(config, out, progress=step, real_limit=args.real_limit and not args.naive_only)
    out_console = Console()
    out_console.print(
        render_summary(result.summary, source=f"{config.model} ({config.size}), {config.turns}-turn chat")
    )
    from memwarden.report.findings import render_findings

    out_console.print(render_findings(result.findings, result.summary.peak_bytes))
    style = "green" if result.fits else "bold red"
    process = ""
    if result.fits and result.limited is not None and result.limited.plain_error is not None:
        style, process = "yellow", " in tensors; the process as a whole does not (the real limit, below)"
    out_console.print(f"[{style}]Peak {verdict(result)}{process}.[/]")
    if result.governed is not None:
        from memwarden.report.console import render_before_after

        out_console.print(render_before_after(result))
        if result.thermal is not None:
            from memwarden.units import format_bytes

            th = result.thermal
            ok = th.failed == 0 and th.check.ok and th.outputs_equal
            style = "green" if ok else "bold red"
            out_console.print(
                f"[{style}]Thermal event ({th.log}, scaled to this model): budget {format_bytes(th.start_budget_bytes)} "
                f"-> {format_bytes(th.min_budget_bytes)} -> {format_bytes(th.end_budget_bytes)}; {th.requests} requests, "
                f"{th.failed} failed, outputs {'exact' if th.outputs_equal else 'changed'}, live memory "
                f"{'always under' if th.check.ok else 'OVER'} the budget in force "
                f"({len([d for d in th.decisions if d['kind'] == 'kv-pool'])} KV-pool resizes).[/]"
            )
        if result.limited is not None:
            lim = result.limited
            ok = lim.governed_error is None or (lim.int4_ran and lim.int4_error is None)
            from rich.markup import escape

            out_console.print(f"[{'green' if ok else 'bold red'}]Real limit: {escape(lim.story)}.[/]", highlight=False)
        out_console.print(
            f"wrote {result.report_path}, {result.trace_path} (before) and "
            f"{result.governed.report_path}, {result.governed.trace_path} (after)"
        )
    else:
        out_console.print(f"wrote {result.report_path} and {result.trace_path}")
    out_console.print(what_next(result.report_path, result.trace_path))
    return 0


def what_next(report: Any, trace: Any) -> str:
    """Where to look and what to try after the demo (commands on lines of their own: copyable)."""
    return (
        f"\n[bold]Next[/]: open {report} in a browser; it starts with the answer (the peak, its cause, the fix).\n"
        "Then try:\n"
        f"  memwarden diagnose {trace}\n"
        "      [dim]the findings, with full fixes and evidence[/]\n"
        "  memwarden trace -o run.mwtrace your_script.py\n"
        "      [dim]your own model; then: memwarden summary run.mwtrace[/]\n"
        "  memwarden estimate llava-1.5-7b --device-profile jetson-orin-nano-8gb\n"
        "      [dim]will a real model fit a device? (no weights needed)[/]\n"
        'More: examples/scenarios/, one folder per overflow pattern (README: "Learn by example").'
    )
