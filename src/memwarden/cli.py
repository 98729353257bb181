"""Command-line entry point: parses arguments and calls the API, nothing more.

Each subcommand lives in ``memwarden.commands.<name>`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a
callable ``(args) -> int`` (the exit status); ``COMMAND_MODULES`` lists them,
imported by name, in the order of ``memwarden --help``.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Sequence
from typing import Protocol

from memwarden.commands import (
    align_check,
    check,
    collect,
    compare,
    demo,
    devices,
    diagnose,
    doctor,
    estimate,
    export,
    lora,
    partition,
    plan,
    replay,
    report,
    stress,
    summary,
    sweep,
    telemetry,
    top,
    trace,
)
from memwarden.commands._help import describe, flag_names
from memwarden.errors import MemwardenError


class Command(Protocol):
    """A subcommand: a module of ``memwarden.commands`` whose ``register`` adds its parser to the
    subparsers and sets ``func`` to a callable ``(args) -> int`` (the exit status)."""

    def register(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...


# Order is the order of `memwarden --help`.
COMMAND_MODULES: tuple[Command, ...] = (
    demo,
    trace,
    collect,
    summary,
    diagnose,
    check,
    report,
    export,
    replay,
    plan,
    estimate,
    devices,
    telemetry,
    stress,
    top,
    sweep,
    doctor,
    align_check,
    lora,
    compare,
    partition,
)
COMMANDS = [m.__name__.rsplit(".", 1)[-1] for m in COMMAND_MODULES]  # type: ignore[attr-defined]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memwarden",
        description="Find, predict and prevent out-of-memory failures of multimodal models on small devices.",
    )
    parser.add_argument("--version", action="version", version=f"memwarden {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMAND_MODULES:
        command.register(sub)
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    for name, subparser in sub.choices.items():
        describe(name, subparser, helps.get(name))
    return parser


def _subparser(parser: argparse.ArgumentParser, name: str | None) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            found: argparse.ArgumentParser = action.choices[name]
            return found
    return None


def _parse(parser: argparse.ArgumentParser, raw: list[str]) -> argparse.Namespace:
    """``parse_args``, except that an unknown option is reported by the subcommand's parser (its
    usage, not the top-level one) with the closest options it does know."""
    args, extras = parser.parse_known_args(raw)
    if not extras:
        return args
    owner = _subparser(parser, getattr(args, "command", None)) or parser
    known = [o for action in owner._actions for o in action.option_strings]
    hints = []
    for extra in extras:
        flag = extra.split("=", 1)[0]
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag.startswith("-") else []
        if close:
            hints.append(f"did you mean {close[0]}?")
    owner.error(f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else ""))


def _version() -> str:
    from memwarden import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    if any("\x00" in a for a in raw):
        parser.error("arguments may not contain NUL bytes")
    args = _parse(parser, raw)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that went away (`| head`) shows up here, inside the handler
        return status
    except BrokenPipeError:
        return _closed_pipe()
    except MemwardenError as exc:
        message = flag_names(str(exc)) if args.command == "estimate" else str(exc)  # the API's names, as flags
        print(f"memwarden {args.command}: error: {message}", file=sys.stderr)
        return getattr(exc, "exit_code", 2)
    except OSError as exc:  # a path the system refuses (too long, unreadable, a directory): the user's to fix
        name = str(exc.filename or "")
        shown = name if len(name) <= 80 else name[:77] + "..."
        print(f"memwarden {args.command}: error: {exc.strerror or exc}{': ' + shown if shown else ''}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"memwarden {args.command}: interrupted", file=sys.stderr)
        return 130


def _closed_pipe() -> int:
    """The reader of stdout went away (``memwarden summary --json | head -2``): end quietly, as
    Unix tools do. Point stdout at /dev/null so the interpreter's final flush cannot fail too."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # stdout replaced by an in-memory stream: nothing to close
        return 0
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return 0


if __name__ == "__main__":
    sys.exit(main())
