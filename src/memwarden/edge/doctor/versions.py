"""Version strings compared the way the known-issue data needs, without ``packaging``.

Release numbers only: "1.20.1" -> (1, 20, 1); local and pre-release tails ("2.4.0+cu121",
"1.19.0rc1", "9.1.0.70") keep their leading numbers. A specifier is comma-separated clauses
">=1.19,<1.22", each compared on the common prefix padded with zeros (so "12" == "12.0").
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"\d+")
_CLAUSE = re.compile(r"^\s*(==|!=|>=|<=|>|<)\s*([0-9][0-9A-Za-z.+-]*)\s*$")


def parse(version: str | int | float) -> tuple[int, ...]:
    """Leading release numbers; () when there are none."""
    text = str(version).strip().lstrip("vVrR")
    parts: list[int] = []
    for piece in text.split("."):
        match = _NUMBER.match(piece)
        if not match:
            break
        parts.append(int(match.group()))
        if match.end() != len(piece):  # "0rc1", "1+cpu": the release part ends here
            break
    return tuple(parts)


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    width = max(len(a), len(b))
    pa, pb = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return (pa > pb) - (pa < pb)


def matches(version: str | int | float, specifier: str) -> bool:
    """Whether ``version`` satisfies every clause of ``specifier``; False for no version."""
    have = parse(version)
    if not have:
        return False
    for clause in specifier.split(","):
        match = _CLAUSE.match(clause)
        if not match:
            raise ValueError(f"bad version clause {clause!r} in {specifier!r}")
        op, want = match.group(1), parse(match.group(2))
        if op == "==" and len(want) < len(have):
            have_cut = have[: len(want)]  # "==12.4" matches 12.4.127: the data names releases
            c = _cmp(have_cut, want)
        else:
            c = _cmp(have, want)
        ok = {"==": c == 0, "!=": c != 0, ">=": c >= 0, "<=": c <= 0, ">": c > 0, "<": c < 0}[op]
        if not ok:
            return False
    return True


def major(version: str | int | float | None) -> int | None:
    parts = parse(version) if version is not None else ()
    return parts[0] if parts else None
