"""Source lines in a trace: the text of the ``line`` and ``stack`` event columns.

A line is ``"file:line:function"`` (the innermost frame of the user's code when the block was
allocated); a stack is frames one a line, innermost first. The recorder hands out *sites*: a
stack whose user frame carries a leading ``*`` (without ``--stacks``, only that one frame).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SourceLine", "parse_line", "split_site"]


@dataclass(frozen=True)
class SourceLine:
    file: str
    line: int
    function: str


def parse_line(text: str) -> SourceLine:
    """``"file:line:function"`` -> its parts (a file name may hold ':' itself, a function never)."""
    file, _, rest = text.rpartition(":")
    file2, _, line = file.rpartition(":")
    try:
        return SourceLine(file2, int(line), rest)
    except ValueError:
        return SourceLine(text, 0, "")


def split_site(site: str) -> tuple[str | None, str | None]:
    """A recorder site -> (the user's line or None, the whole stack or None if only one frame)."""
    frames = site.split("\n")
    user = next((f[1:] for f in frames if f.startswith("*")), None)
    if len(frames) == 1:
        return user, None
    return user, "\n".join(f.lstrip("*") for f in frames)
