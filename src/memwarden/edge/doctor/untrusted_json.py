"""JSON that someone else wrote (a facts file from another machine, a pipeline config), read safely.

A regular file only, within a byte budget (``memwarden.untrusted.read_regular``: a FIFO would block
for ever, ``/dev/zero`` never ends); integers of at most 19 digits (past 2**63 nothing is a count
or a size, and a 400-digit one overflows every float it meets); no ``NaN``/``Infinity`` and no
float that overflows to infinity; nesting at most ``MAX_DEPTH`` deep; lone surrogates (``"\\ud800"``,
which no terminal can encode) replaced by U+FFFD in keys and strings. Every problem is one
``InputError`` naming the file.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from memwarden.errors import InputError
from memwarden.untrusted import read_regular, terminal_safe

__all__ = ["MAX_DEPTH", "loads", "read"]

MAX_DEPTH = 64  # a facts file is 5 levels deep; a config a dozen
_MAX_INT_DIGITS = 19
_SURROGATE = re.compile("[\ud800-\udfff]")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS or abs(value := int(text)) > 2**63:
        shown = text if len(text) <= 24 else f"a {len(text.lstrip('-'))}-digit number"
        raise InputError(f"{shown} is out of range (integers up to 2**63)")
    return value


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InputError(f"{text[:24]}{'...' if len(text) > 24 else ''} is out of range (not a finite number)")
    return value


def _constant(text: str) -> float:
    raise InputError(f"{text} is not a number JSON allows (expected a finite number)")


def _clean(node: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise InputError(f"nested more than {MAX_DEPTH} levels deep")
    if isinstance(node, str):
        return _SURROGATE.sub("\ufffd", node) if _SURROGATE.search(node) else node
    if isinstance(node, dict):
        return {_clean(k, depth): _clean(v, depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_clean(v, depth + 1) for v in node]
    return node


def loads(raw: bytes | str) -> Any:
    """``raw`` as JSON within the limits above; ``InputError`` (without the file's name) otherwise."""
    try:
        return _clean(json.loads(raw, parse_int=_int, parse_float=_float, parse_constant=_constant), 0)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        kind = "nested too deep" if isinstance(exc, RecursionError) else terminal_safe(exc)
        raise InputError(f"invalid JSON ({kind})") from None


def read(path: str | os.PathLike[str], max_bytes: int, *, what: str) -> Any:
    """The JSON in ``path``, a regular file of at most ``max_bytes``; one ``InputError`` otherwise."""
    label = terminal_safe(path)
    try:
        raw = read_regular(path, max_bytes, what=what)
    except InputError as exc:
        raise InputError(f"cannot read {what}: {terminal_safe(exc)}") from None
    try:
        return loads(raw)
    except InputError as exc:
        raise InputError(f"{label}: not {what}: {exc}") from None
