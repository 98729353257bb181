"""One place for reading untrusted input: files, numbers and text that came from outside.

Every reader of a file a user, a server or a model author wrote goes through here, so the
limits are the same everywhere and documented once (docs/security.md):

- ``read_regular``: a regular file only (a FIFO would block every reader for ever, ``/dev/zero``
  never ends), opened without blocking and checked with ``fstat`` on the open descriptor (no
  race between the check and the read), read with a byte budget;
- ``finite_int`` / ``finite_float``: numbers that are exact, finite and in range before anything
  is sized or looped by them (a 400-digit integer or ``inf`` is one error, not an
  ``OverflowError`` traceback);
- ``terminal_safe`` / ``markup_safe``: text shown on a terminal with its control characters
  (escape sequences, OSC titles, clear-screen) made visible, and rich markup escaped.

Errors are ``InputError`` naming the file and the field: the CLI prints one line.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import BinaryIO

from memwarden.errors import InputError

__all__ = ["finite_float", "finite_int", "markup_safe", "open_regular", "read_regular", "terminal_safe"]


def open_regular(path: str | os.PathLike[str], label: str, expected: str) -> BinaryIO:
    """``path`` opened for reading, streamed, if it is a regular file: a FIFO would block the reader
    for ever and ``/dev/zero`` never ends. The check is ``fstat`` on the opened descriptor (no race);
    ``expected`` names what the file should be, for the error."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{label}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{label}: is a directory, expected {expected}") from None
    except OSError as exc:
        raise InputError(f"{label}: cannot read ({exc.strerror or type(exc).__name__})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise InputError(f"{label}: is a directory, expected {expected}")
        raise InputError(f"{label}: not a regular file (a FIFO, device or socket); expected {expected}")
    return os.fdopen(fd, "rb")


def read_regular(path: str | os.PathLike[str], max_bytes: int, *, what: str = "file") -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes``; ``InputError`` otherwise."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{p}: no such file ({what})") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot open ({exc.strerror or type(exc).__name__}; {what})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO, device or socket"
            raise InputError(f"{p}: not a regular file ({kind}); expected {what}")
        if st.st_size > max_bytes:
            raise InputError(f"{p}: {st.st_size} bytes, over the {max_bytes}-byte limit for {what}")
        chunks, total = [], 0
        while True:  # a file that grows while read is still cut at the budget
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise InputError(f"{p}: over the {max_bytes}-byte limit for {what}")
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"{p}: cannot read ({exc.strerror or type(exc).__name__}; {what})") from None
    finally:
        os.close(fd)


def finite_int(value: object, field: str, *, lo: int = 0, hi: int = 2**53) -> int:
    """``value`` as an exact integer in ``[lo, hi]`` (bools, floats with a fraction, NaN refused)."""
    if isinstance(value, bool):
        raise InputError(f"{field}: expected an integer, got a boolean")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise InputError(f"{field}: expected an integer, got {value!r}")
        value = int(value)
    if not isinstance(value, int):
        raise InputError(f"{field}: expected an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        shown = str(value) if value.bit_length() < 200 else f"a {len(str(abs(value)))}-digit number"
        raise InputError(f"{field}: {shown} is out of range [{lo}, {hi}]")
    return value


def finite_float(value: object, field: str, *, lo: float = -math.inf, hi: float = math.inf) -> float:
    """``value`` as a finite float in ``[lo, hi]`` (NaN, inf and huge integers refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{field}: expected a number, got {type(value).__name__}")
    if isinstance(value, int) and value.bit_length() > 1000:
        raise InputError(f"{field}: a {len(str(abs(value)))}-digit number is out of range")
    out = float(value)
    if not math.isfinite(out):
        raise InputError(f"{field}: expected a finite number, got {value!r}")
    if not lo <= out <= hi:
        raise InputError(f"{field}: {out:g} is out of range [{lo:g}, {hi:g}]")
    return out


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)] if c not in (0x0A,)}
_CONTROL[0x09] = " "


def terminal_safe(text: object, *, keep_newlines: bool = False) -> str:
    """``text`` with control characters shown as ``\\xNN`` (no escape sequence reaches the terminal),
    lone surrogates replaced; newlines kept only when asked."""
    s = str(text).encode("utf-8", "replace").decode("utf-8")
    table = dict(_CONTROL)
    if not keep_newlines:
        table[0x0A] = "\\n"
    return s.translate(table)


def markup_safe(text: object) -> str:
    """``terminal_safe`` text with rich markup escaped (``[link=...]`` shown, never applied)."""
    return terminal_safe(text).replace("\\[", "\\\\[").replace("[", "\\[")
