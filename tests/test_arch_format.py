"""The formatter is the style (issue 40): a ``# fmt: skip`` / ``# fmt: off`` is an exception a reader
must be told about, so there are few of them (the issue counted 399; 11 at the second pass,
examples that keep a user's own layout hold most), and a new one needs a reason to exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FORMAT_EXCEPTIONS = 20  # fewer than this many in src/, tests/, benchmarks/ and examples/ together
_MARK = re.compile(r"#\s*fmt:\s*(skip|off)\b")


def _format_exceptions() -> list[str]:
    found = []
    for folder in ("src", "tests", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue  # this file names the marks
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _MARK.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}")
    return found


def test_few_lines_are_kept_out_of_the_formatter() -> None:
    found = _format_exceptions()
    assert len(found) < MAX_FORMAT_EXCEPTIONS, found
    assert not [f for f in found if f.startswith("src/")]  # the library itself is formatted throughout


def test_the_search_sees_both_marks() -> None:
    assert _MARK.search("x = [1,2]  # fmt: skip") and _MARK.search("#fmt:off") and not _MARK.search("# fmt: on")
