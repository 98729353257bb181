"""Run every real-world case under capture, diagnose it, and score recall and precision per pattern.

A case is a script in this folder that sets ``EXPECT`` (the pattern id it plants, or ``None`` for a
fixed twin or a correct library path) and, when it plants one, ``FIX_WORDS`` (words the finding's fix
must contain, at least one of them). A planted case counts as found when a finding of its pattern
(any severity) names one of the fix words; a clean case is clean when no finding is medium or high.

Run: ``python examples/realworld/accuracy.py`` (add ``--json`` for the per-case results;
``--corpus DIR`` scores another folder of cases, e.g. ``examples/postfreeze``; ``--case TEXT`` keeps the cases whose name contains it; ``--verbose`` prints each finding's first line, saving and fix; ``--cli`` runs each
case through ``memwarden trace`` and ``memwarden diagnose --json`` in subprocesses, as documented). A planted case may
mark the line the user must change with a trailing ``# MISTAKE`` comment; a found case then also
counts whether the finding's first line (as ``diagnose --json`` gives it in ``lines``) is that one. Each case
runs as ``memwarden trace case.py`` runs it (as ``__main__``, its folder on ``sys.path``) and is
diagnosed as ``memwarden diagnose --json`` does.
"""

from __future__ import annotations

import ast
import contextlib
import json
import runpy
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Case:
    path: Path
    expect: str | None
    fix_words: tuple[str, ...]
    mistake_line: int | None = None
    mistake_lines: tuple[int, int] | None = None  # the statement holding the mark (a call may span lines)

    @property
    def name(self) -> str:
        return self.path.stem


def cases(folder: Path = HERE) -> list[Case]:
    """Every script of ``folder`` that declares ``EXPECT``, by name."""
    found = []
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        values: dict[str, Any] = {}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if node.targets[0].id in ("EXPECT", "FIX_WORDS"):
                    values[node.targets[0].id] = ast.literal_eval(node.value)
        if "EXPECT" in values:
            marked = [
                i for i, text in enumerate(path.read_text().splitlines(), 1) if text.rstrip().endswith("# MISTAKE")
            ]
            span = _statement_span(path, marked[0]) if marked else None
            words = tuple(values.get("FIX_WORDS", ()))
            found.append(Case(path, values["EXPECT"], words, marked[0] if marked else None, span))
    return found


def _statement_span(path: Path, line: int) -> tuple[int, int]:
    """The lines of the smallest simple statement (not a loop, block or definition) holding ``line``."""
    compound = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.While, ast.With, ast.If, ast.Try)
    spans = [
        (node.lineno, node.end_lineno or node.lineno)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.stmt)
        and not isinstance(node, compound)
        and node.lineno <= line <= (node.end_lineno or node.lineno)
    ]
    return min(spans, key=lambda s: s[1] - s[0]) if spans else (line, line)


@contextlib.contextmanager
def _as_main(path: Path) -> Iterator[None]:
    import torch

    saved_argv, saved_threads = sys.argv[:], torch.get_num_threads()
    sys.argv = [str(path)]
    sys.path.insert(0, str(path.parent))
    torch.set_num_threads(1)  # tiny models: a thread pool costs more than the work; allocations are the same
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path.remove(str(path.parent))
        torch.set_num_threads(saved_threads)


def diagnose_case(case: Case) -> list[dict[str, Any]]:
    """The findings of ``memwarden diagnose --json`` on a capture of the case."""
    import memwarden
    from memwarden.analyze.diagnose import diagnose

    with _as_main(case.path), memwarden.capture() as cap:
        runpy.run_path(str(case.path), run_name="__main__")
    assert cap.trace is not None
    return [f.to_json() for f in diagnose(cap.trace)]


def diagnose_case_cli(case: Case) -> list[dict[str, Any]]:
    """The same, through the commands exactly as a user runs them: ``memwarden trace -o T case.py``
    (a supervised child: resident samples too) then ``memwarden diagnose --json T``."""
    import subprocess
    import tempfile

    memwarden_cli = [sys.executable, "-m", "memwarden"]
    with tempfile.TemporaryDirectory(prefix="mw-accuracy-") as tmp:
        out = Path(tmp) / f"{case.name}.mwtrace"
        subprocess.run(
            [*memwarden_cli, "trace", "-o", str(out), case.path.name],
            cwd=case.path.parent,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        done = subprocess.run(
            [*memwarden_cli, "diagnose", "--json", str(out)], check=True, capture_output=True, text=True
        )
    return list(json.loads(done.stdout)["findings"])


def verdict(case: Case, findings: list[dict[str, Any]]) -> dict[str, Any]:
    loud = [f["pattern"] for f in findings if f["severity"] in ("high", "medium")]
    out: dict[str, Any] = {
        "case": case.name,
        "expect": case.expect,
        "loud": loud,
        "found": [f"{f['pattern']}:{f['severity']}" for f in findings],
    }
    if case.expect is None:
        out["ok"] = not loud
    else:
        mine = [f for f in findings if f["pattern"] == case.expect]
        out["named"] = bool(mine)
        out["fix_ok"] = any(w in f["fix"] for f in mine for w in case.fix_words) if case.fix_words else bool(mine)
        out["ok"] = out["named"] and out["fix_ok"]
        lo, hi = case.mistake_lines or (case.mistake_line or 0, case.mistake_line or 0)
        if case.mistake_line is not None and out["ok"]:
            first = [f["lines"][0] for f in mine if f["lines"]]
            out["line_ok"] = any(Path(x["file"]).name == case.path.name and lo <= x["line"] <= hi for x in first)
        if case.mistake_line is not None:  # the line a user reads first, whatever the pattern (for a peer)
            top = findings[0]["lines"][0] if findings and findings[0]["lines"] else None
            out["top_line_ok"] = bool(top and Path(top["file"]).name == case.path.name and lo <= top["line"] <= hi)
    return out


def score(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per pattern: planted cases found (recall) and medium/high findings that were right (precision)."""
    table: dict[str, dict[str, Any]] = {}
    for r in results:
        for pattern in {r["expect"], *r["loud"]} - {None}:
            row = table.setdefault(pattern, {"planted": 0, "found": 0, "loud": 0, "loud_right": 0})
            if r["expect"] == pattern:
                row["planted"] += 1
                row["found"] += int(r["ok"])
            if pattern in r["loud"]:
                row["loud"] += 1
                row["loud_right"] += int(r["expect"] == pattern)
    return table


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Score memwarden diagnose on a folder of planted cases and twins.")
    parser.add_argument("--corpus", type=Path, default=HERE, help="folder of cases (default: examples/realworld)")
    parser.add_argument("--case", default="", help="keep only the cases whose name contains this text")
    parser.add_argument("--cli", action="store_true", help="run each case through `memwarden trace` + `diagnose`")
    parser.add_argument("--json", action="store_true", help="print the per-case results as JSON")
    parser.add_argument("--verbose", action="store_true", help="print each finding's first line, saving and fix")
    args = parser.parse_args()
    folder = args.corpus.resolve()
    if not folder.is_dir():
        parser.error(f"no such folder: {folder}")
    results = []
    run = diagnose_case_cli if args.cli else diagnose_case
    for case in cases(folder):
        if args.case not in case.name:
            continue
        findings = run(case)
        results.append(verdict(case, findings))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        if args.verbose:  # each finding's first line, saving and fix, for reading a miss
            for f in findings:
                first = f["lines"][0] if f["lines"] else {}
                where = f"{Path(first.get('file', '?')).name}:{first.get('line', '?')}"
                print(
                    f"    {f['pattern']}:{f['severity']} at {where} saves {f['saving_peak_bytes']} B "
                    f"| {f['fix'][:160]}",
                    file=sys.stderr,
                    flush=True,
                )
    table = score(results)
    if args.json:
        print(json.dumps({"cases": results, "patterns": table}, indent=2))
        return
    print("| pattern | planted | found | recall | medium/high findings | right | precision |")
    print("|---|---|---|---|---|---|---|")
    for pattern, row in sorted(table.items()):
        recall = f"{row['found'] / row['planted']:.0%}" if row["planted"] else "-"
        precision = f"{row['loud_right'] / row['loud']:.0%}" if row["loud"] else "-"
        print(
            f"| {pattern} | {row['planted']} | {row['found']} | {recall} | {row['loud']} | {row['loud_right']} | {precision} |"
        )
    planted = [r for r in results if r["expect"]]
    clean = [r for r in results if not r["expect"]]
    marked = [r for r in planted if "line_ok" in r]
    print(
        f"\nrecall {sum(r['ok'] for r in planted)}/{len(planted)}; "
        f"clean cases without a medium/high finding {sum(r['ok'] for r in clean)}/{len(clean)}; "
        f"line to change named first {sum(r['line_ok'] for r in marked)}/{len(marked)} of the found marked cases"
    )


if __name__ == "__main__":
    main()
