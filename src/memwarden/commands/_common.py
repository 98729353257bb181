"""Helpers shared by subcommands: loading inputs with clear errors, JSON output."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from memwarden.errors import InputError
from memwarden.trace.model import Trace, TraceFormatError


def load_trace(path: str) -> Trace:
    """A .mwtrace or a PyTorch memory snapshot pickle, or one clear InputError."""
    try:
        from memwarden.interop.files import load_any
    except ImportError:  # snapshot support not installed
        return _load_mwtrace(path)
    return load_any(path)


def _load_mwtrace(path: str) -> Trace:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{path}: no such file")
    try:
        from memwarden.trace.io import load

        return load(p)
    except TraceFormatError as exc:
        raise InputError(f"{path}: {exc}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def bytes_option(flag: str, text: str) -> int:
    """A byte-size option (``--budget 6GiB``) as bytes, read here once for every command: an
    InputError naming ``flag`` for what is no byte quantity (the message shows the value and the
    accepted forms)."""
    from memwarden.units import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise InputError(f"{flag}: {exc}") from None


def pick_device(trace: Trace, wanted: str | None) -> int:
    """A device index from ``--device`` (index or name), else the trace's primary device: the
    one rule (``Analysis.device``) that summary, diagnose and report use too."""
    if wanted is None:
        from memwarden.analyze.analysis import Analysis

        return Analysis(trace).device
    if wanted in trace.devices:
        return trace.devices.index(wanted)
    try:
        index = int(wanted)
    except ValueError:
        index = -1
    if not 0 <= index < len(trace.devices):
        raise InputError(f"--device {wanted!r} is not in this trace (devices: {', '.join(trace.devices)})")
    return index


def print_json(data: Any) -> None:
    """``data`` as JSON on stdout, always valid JSON: a non-finite number (which ``json`` would print as
    a bare ``Infinity``/``NaN``) is written as ``null``."""
    json.dump(_finite(data), sys.stdout, indent=2, default=_default, allow_nan=False)
    sys.stdout.write("\n")


def _finite(value: Any, depth: int = 0) -> Any:
    """``value`` with every non-finite float replaced by None (objects through their JSON form)."""
    if depth > 200:  # json itself refuses deeper nesting; let it say so
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: _finite(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v, depth + 1) for v in value]
    if isinstance(value, str | int | bool) or value is None:
        return value
    if hasattr(value, "to_json") or hasattr(value, "tolist"):
        return _finite(_default(value), depth + 1)
    return value


def _default(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def wrote(path: object, detail: str = "") -> None:
    """The one success line of every command that writes a file: ``wrote PATH (detail)``. On
    stdout, unless stdout carries the data itself (``-o -``), then on stderr."""
    text = str(path)
    line = f"wrote {'stdout' if text == '-' else text}" + (f" ({detail})" if detail else "")
    print(line, file=sys.stderr if text == "-" else sys.stdout)
