"""Reading small system files where absence and refusal are facts, not errors.

Private to ``sources/`` (not a fact source itself): the sources import its functions by name.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["read_int", "read_text"]


def read_text(path: str | Path, limit_bytes: int = 65536) -> str | None:
    """The file's first ``limit_bytes`` as text, or None when it is missing, unreadable or not a
    regular file (opened without blocking and checked on the descriptor: a FIFO named by an
    environment variable or planted in a cache directory must not hang the doctor; /proc and /sys
    files are regular)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], limit_bytes
        while left > 0 and (chunk := os.read(fd, min(left, 65536))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def read_int(path: str | Path) -> int | None:
    raw = read_text(path, 256)
    try:
        return int(raw.strip()) if raw is not None else None
    except ValueError:
        return None
