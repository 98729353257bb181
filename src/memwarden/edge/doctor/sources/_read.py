"""Reading small system files where absence and refusal are facts, not errors."""

from __future__ import annotations

from pathlib import Path


def text(path: str | Path, limit_bytes: int = 65536) -> str | None:
    """The file's text, or None when it is missing, unreadable or not a file."""
    try:
        with open(path, "rb") as fh:
            return fh.read(limit_bytes).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def integer(path: str | Path) -> int | None:
    raw = text(path, 256)
    try:
        return int(raw.strip()) if raw is not None else None
    except ValueError:
        return None
