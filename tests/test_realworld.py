"""The real-world corpus (``examples/realworld/``): reproductions of memory mistakes from public
issues and forums, their fixed twins, and correct library code paths.

Each case runs under capture as ``memwarden trace`` runs it and is diagnosed as ``memwarden
diagnose --json`` does (``examples/realworld/accuracy.py``). A planted case must be named, with a
fix that names the change its source gives; a fixed twin or library path must raise nothing of
medium or high severity. ``docs/diagnose-accuracy.md`` reports the same runs as recall/precision.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

CORPUS = Path(__file__).resolve().parents[1] / "examples" / "realworld"


def _accuracy() -> ModuleType:
    spec = importlib.util.spec_from_file_location("realworld_accuracy", CORPUS / "accuracy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


accuracy = _accuracy()
CASES = accuracy.cases()
PLANTED = [c for c in CASES if c.expect]
CLEAN = [c for c in CASES if not c.expect]

# Cases the detectors do not get right yet (see docs/diagnose-accuracy.md, "Not yet"): marked
# xfail(strict=True), so fixing one fails here until it is moved out of this list.
KNOWN_MISSES: set[str] = set()


def test_corpus_size_and_sources() -> None:
    assert len(CASES) >= 30
    for case in CASES:
        doc = case.path.read_text().split('"""')[1]
        assert "http" in doc or "memwarden issue" in doc, f"{case.name}: no source quoted"
        if case.expect:
            assert case.fix_words, f"{case.name}: a planted case names the words its fix must contain"


def _param(case: object) -> object:
    name = case.name  # type: ignore[attr-defined]
    marks = [pytest.mark.xfail(strict=True, reason="known miss")] if name in KNOWN_MISSES else []
    return pytest.param(case, id=name, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in PLANTED])
def test_planted_case_is_named_with_its_fix(case: object) -> None:
    result = accuracy.verdict(case, accuracy.diagnose_case(case))
    assert result["named"], result
    assert result["fix_ok"], result


@pytest.mark.parametrize("case", [_param(c) for c in CLEAN])
def test_clean_case_raises_nothing_medium_or_high(case: object) -> None:
    result = accuracy.verdict(case, accuracy.diagnose_case(case))
    assert not result["loud"], result
