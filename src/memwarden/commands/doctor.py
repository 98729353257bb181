"""memwarden doctor [--json] [--pipeline CONFIG] [--collect -o FACTS] [--facts FACTS]"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="check this edge environment (runtimes, providers, drivers, audio, caches) against known issues",
        description=(
            "Collect facts about this machine (Python, torch/CUDA/cuDNN, every onnxruntime package and which of "
            "its providers really start, NVIDIA driver, Jetson L4T, audio device rates, memory and cgroup limit, "
            "thermal zones, engine caches) and check them against known incompatibilities, each with its fix and "
            "public source. --collect writes the facts to a file on a device; --facts diagnoses such a file "
            "anywhere. Exit status: 0 no findings, 1 findings, 2 bad input."
        ),
    )
    p.add_argument("--json", action="store_true", help="print findings (and facts) as JSON")
    p.add_argument(
        "--pipeline", metavar="CONFIG", help="pipeline config (MediaPipe .pbtxt/JSON) whose audio rate / fps to check"
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--collect", action="store_true", help="collect facts only and write them (-o) or print them")
    mode.add_argument(
        "--facts", metavar="FACTS", help="diagnose a facts file collected elsewhere instead of this machine"
    )
    p.add_argument("-o", "--output", metavar="FACTS", help="with --collect: the facts file to write")
    p.add_argument(
        "--cache-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="an engine/EP cache directory to inspect (repeatable)",
    )
    p.add_argument("--no-probe", action="store_true", help="never load torch/onnxruntime, even in a subprocess")
    p.add_argument(
        "--probe-timeout", type=float, default=5.0, metavar="S", help="deadline for the library probes (default 5 s)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.edge.doctor import facts as doctor_facts
    from memwarden.edge.doctor.checks import diagnose
    from memwarden.edge.doctor.pipeline import read as read_pipeline
    from memwarden.errors import InputError

    if args.output and not args.collect:
        raise InputError("-o/--output goes with --collect")
    if not 0 < args.probe_timeout <= 3600:  # inf and NaN fail too: a deadline that never comes is none
        raise InputError(f"--probe-timeout must be more than 0 and at most 3600 seconds (got {args.probe_timeout})")
    if args.facts:
        facts = doctor_facts.load(args.facts)
        if args.pipeline:
            facts["pipeline"] = read_pipeline(args.pipeline)
    else:
        facts = doctor_facts.collect(
            pipeline=args.pipeline,
            cache_dirs=tuple(args.cache_dir),
            probe=not args.no_probe,
            probe_timeout_s=args.probe_timeout,
        )
    if args.collect:
        if args.output:
            doctor_facts.dump(facts, args.output)
            print(f"wrote {args.output}")
        else:
            from memwarden.commands._common import print_json

            print_json(facts)
        return 0
    findings = diagnose(facts)
    if args.json:
        from memwarden.commands._common import print_json

        print_json({"findings": [f.to_json() for f in findings], "facts": facts})
        return 1 if findings else 0
    _print(facts, findings)
    return 1 if findings else 0


def _summary(facts: dict[str, Any]) -> list[tuple[str, str]]:
    from memwarden.units import format_bytes

    def get(*path: str) -> Any:
        node: Any = facts
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        return node

    def providers() -> str:
        found = get("onnxruntime", "providers") or {}
        started = [p for p, e in found.items() if isinstance(e, dict) and e.get("starts")]
        failed = [p for p in found if p not in started]
        return (
            ", ".join(started) + (f" (failed: {', '.join(failed)})" if failed else "")
            if found
            else str(get("onnxruntime", "probe") or "-")
        )

    def memory() -> str:
        total, limit = get("memory", "total_bytes"), get("memory", "cgroup", "limit_bytes")
        return (format_bytes(total) if total else "?") + (f", cgroup limit {format_bytes(limit)}" if limit else "")

    rows = {
        "python": lambda: str(get("platform", "python") or "?"),
        "torch": lambda: (
            str(get("torch", "version") or "not present")
            + (f", CUDA {get('torch', 'cuda')}" if get("torch", "cuda") else "")
        ),
        "onnxruntime": lambda: (
            ", ".join(f"{n} {v}" for n, v in (get("onnxruntime", "packages") or {}).items()) or "not present"
        ),
        "ORT providers": providers,
        "NVIDIA driver": lambda: (
            f"{get('nvidia', 'driver')} (CUDA {get('nvidia', 'cuda_driver')})"
            if get("nvidia", "driver")
            else "not present"
        ),
        "Jetson L4T": lambda: str(get("jetson", "l4t") or "not present"),
        "memory": memory,
        "audio": lambda: (
            ", ".join(f"{d['id']} {d['rate_hz']} Hz" for d in get("audio", "devices") or [] if d.get("rate_hz"))
            or "none open"
        ),
        "thermal zones": lambda: str(len(get("thermal", "zones") or [])),
        "caches": lambda: str(len(facts.get("caches") or [])),
    }
    if facts.get("pipeline"):
        rows["pipeline"] = lambda: (
            f"{get('pipeline', 'audio_rate_hz') or '-'} Hz, {get('pipeline', 'video_fps') or '-'} fps"
        )
    out = []
    for key, value in rows.items():
        try:
            out.append((key, value()))
        except (
            AttributeError,
            TypeError,
            ValueError,
            KeyError,
            ArithmeticError,
        ):  # hand-written facts: show, don't fail
            out.append((key, "?"))
    return out


def _print(facts: dict[str, Any], findings: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from memwarden.untrusted import markup_safe, terminal_safe

    console = Console()
    table = Table(title="Environment", show_header=False)
    table.add_column("fact", style="bold", no_wrap=True)
    table.add_column("value")
    for key, value in _summary(facts):  # facts are someone else's text: no markup, no escape sequences
        table.add_row(key, markup_safe(value if len(value) <= 500 else value[:497] + "..."))
    console.print(table)
    if not findings:
        console.print("[green]No known issue matches this environment.[/green]")
        return
    colour = {"high": "red", "medium": "yellow", "low": "cyan"}
    for f in findings:
        console.print(
            f"\n[bold {colour.get(f.severity, 'white')}]{markup_safe(f.severity.upper())}[/] "
            f"[bold]{markup_safe(f.id)}[/]: {markup_safe(f.title)}"
        )
        console.print(f"  here: {terminal_safe(f.detail)}", highlight=False, markup=False)
        console.print(f"  symptom: {f.symptom}", highlight=False, markup=False)
        console.print(f"  fix: {f.fix}", highlight=False, markup=False)
        console.print(f"  affected: {f.affected}", highlight=False, markup=False)
        for src in f.sources:
            console.print(f"  source: {src}", highlight=False, markup=False, soft_wrap=True)  # URLs stay whole
