"""The line to change, named by memray: the peer a careful Python user runs on the same cases.

memray (https://bloomberg.github.io/memray/) records every allocation with its Python stack; its
default view of a run, the flame graph of ``memray flamegraph``, shows the allocations live at the
high-water mark. A user reads the heaviest line of their own script there. This script does the
same, at memray's defaults (``memray run``, no ``--native``; ``--aggregate``, memray's
compact output for long runs, holds the same high-water-mark records): for every planted case of a corpus
that marks its mistake (``# MISTAKE``), it runs the case under ``memray run``, takes the records at
the high-water mark (``FileReader.get_high_watermark_allocation_records``), sums their bytes per
line of the case's script (the innermost frame of each stack in the script itself, as memwarden
names the script's line above a helper module; else the innermost in the case's folder; import
statements left out: what importing torch keeps is no line a user changes), and checks whether the
heaviest line lies in the marked statement, as ``accuracy.py`` checks memwarden's first line.

Run: ``python examples/realworld/peer_memray.py --corpus examples/postfreeze [--json]``. memray
names no pattern and no fix; only the line is compared.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

from accuracy import Case, cases

HERE = Path(__file__).resolve().parent


@cache
def _import_lines(file: str) -> frozenset[int]:
    try:
        tree = ast.parse(Path(file).read_text())
    except (OSError, SyntaxError):
        return frozenset()
    return frozenset(n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))


@cache
def _resolved(file: str, cwd: str) -> str:
    """``file`` as a stack names it, made absolute: the script ran from its own folder, so a relative
    name (the script itself, as ``memray run`` was given it) is relative to that folder."""
    return str((Path(cwd) / file).resolve())


def heaviest_line(case: Case) -> tuple[str, int, int] | None:
    """(file, line, bytes) of the case folder's line holding the most at memray's high-water mark."""
    from memray import FileReader

    with tempfile.TemporaryDirectory(prefix="mw-memray-") as tmp:
        out = Path(tmp) / "run.bin"
        subprocess.run(
            [sys.executable, "-m", "memray", "run", "-q", "--aggregate", "-o", str(out), case.path.name],
            cwd=case.path.parent,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        reader = FileReader(str(out))
        folder, script = str(case.path.parent), str(case.path.resolve())
        per_line: Counter[tuple[str, int]] = Counter()
        for record in reader.get_high_watermark_allocation_records(merge_threads=True):
            # the script's own innermost line (a helper module it imports makes what the script asks
            # for: the script's line is the one a user changes, as memwarden's first line is), else
            # the folder's innermost line
            frames = [(f, ln) for _fn, f, ln in record.stack_trace() if _resolved(f, folder).startswith(folder)]
            mine = [(f, ln) for f, ln in frames if _resolved(f, folder) == script] or frames[:1]
            if mine and mine[0][1] not in _import_lines(
                _resolved(mine[0][0], folder)
            ):  # importing torch is no line to change
                per_line[mine[0]] += record.size
        reader.close()
    if not per_line:
        return None
    (file, line), nbytes = per_line.most_common(1)[0]
    return file, line, nbytes


def main() -> None:
    folder = Path(sys.argv[sys.argv.index("--corpus") + 1]).resolve() if "--corpus" in sys.argv else HERE
    results: list[dict[str, Any]] = []
    for case in cases(folder):
        if not case.expect or case.mistake_lines is None:
            continue
        top = heaviest_line(case)
        lo, hi = case.mistake_lines
        named = top is not None and _resolved(top[0], str(case.path.parent)) == str(case.path.resolve())
        named = named and top is not None and lo <= top[1] <= hi
        results.append(
            {
                "case": case.name,
                "expect": case.expect,
                "memray_line": top[:2] if top else None,
                "mistake": [lo, hi],
                "line_ok": named,
            }
        )
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    if "--json" in sys.argv:
        print(json.dumps(results, indent=2))
        return
    print(
        f"memray's heaviest line at the high-water mark is the line to change in "
        f"{sum(r['line_ok'] for r in results)}/{len(results)} marked planted cases"
    )


if __name__ == "__main__":
    main()
