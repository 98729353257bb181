"""Command-line entry point: parses arguments and calls the API, nothing more.

Each subcommand lives in ``memwarden.commands.<name>`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a
callable ``(args) -> int`` (the exit status).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from memwarden.errors import MemwardenError
from memwarden.trace.model import TraceFormatError

# Order is the order of `memwarden --help`.
COMMANDS = [
    "demo",
    "trace",
    "summary",
    "diagnose",
    "report",
    "export",
    "replay",
    "plan",
    "estimate",
    "devices",
    "telemetry",
    "stress",
    "sweep",
    "doctor",
    "align_check",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memwarden",
        description="Find, predict and prevent out-of-memory failures of multimodal models on small devices.",
    )
    parser.add_argument("--version", action="version", version=f"memwarden {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"memwarden.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"memwarden.commands.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def _version() -> str:
    from memwarden import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    if any("\x00" in a for a in raw):
        parser.error("arguments may not contain NUL bytes")
    args = parser.parse_args(raw)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (MemwardenError, TraceFormatError) as exc:
        print(f"memwarden {args.command}: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 2)
    except OSError as exc:  # a path the system refuses (too long, unreadable, a directory): the user's to fix
        name = str(exc.filename or "")
        shown = name if len(name) <= 80 else name[:77] + "..."
        print(f"memwarden {args.command}: error: {exc.strerror or exc}{': ' + shown if shown else ''}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"memwarden {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
