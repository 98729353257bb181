"""Facts in, findings out: derived facts, then every known issue whose conditions all hold.

The known issues are data (``known_issues.json``): each entry has conditions over fact paths
("packages.installed.onnxruntime-gpu", "derived.ort_failed_providers"), the affected versions,
the symptom, the fix and its public sources. Comparisons that need arithmetic across sources
(a device's rate against the pipeline's, a cache's builder against the installed runtime) are
computed once here as ``derived.*`` facts, so the data stays declarative.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from memwarden.edge.doctor import versions
from memwarden.edge.doctor.derive import derive
from memwarden.errors import InputError
from memwarden.untrusted import terminal_safe

DATA = Path(__file__).with_name("known_issues.json")
_PLACEHOLDER = re.compile(r"\{([\w.\-]+)\}")
_OPS = ("equals", "in", "version", "matches", "gt", "lt", "present", "nonempty")


@dataclass(frozen=True)
class Finding:
    id: str
    title: str
    severity: str  # high: it fails or silently runs slow; medium: it will under load; low: worth knowing
    detail: str  # this machine's numbers
    symptom: str
    fix: str
    affected: str
    sources: tuple[str, ...]
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "sources": list(self.sources)}


@cache
def known_issues() -> dict[str, Any]:
    data = json.loads(DATA.read_text(encoding="utf-8"))
    for entry in data["issues"]:
        _validate(entry["when"], entry["id"])
    return data


def _validate(conditions: list[dict[str, Any]], where: str) -> None:
    for cond in conditions:
        if "any" in cond or "all" in cond:
            _validate(cond.get("any") or cond.get("all") or [], where)
        elif "fact" not in cond or not any(op in cond for op in _OPS):
            raise ValueError(f"known_issues.json: {where}: bad condition {cond}")


def lookup(facts: dict[str, Any], path: str) -> Any:
    node: Any = facts
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _holds(facts: dict[str, Any], cond: dict[str, Any]) -> bool:
    if "any" in cond:
        return any(_holds(facts, c) for c in cond["any"])
    if "all" in cond:
        return all(_holds(facts, c) for c in cond["all"])
    value = lookup(facts, cond["fact"])
    if "present" in cond:
        return (value is not None and value != "" and value != []) == cond["present"]
    if value is None:
        return False
    if "nonempty" in cond:
        return bool(value) == cond["nonempty"]
    if "equals" in cond:
        return bool(value == cond["equals"])
    if "in" in cond:
        return value in cond["in"]
    if "version" in cond:
        return versions.matches(value, cond["version"])
    if "matches" in cond:
        return re.search(cond["matches"], str(value)) is not None
    if not isinstance(value, int | float):
        return False
    return value > cond["gt"] if "gt" in cond else value < cond["lt"]


def _paths(conditions: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for cond in conditions:
        out += _paths(cond.get("any", cond.get("all", []))) if "any" in cond or "all" in cond else [cond["fact"]]
    return out


def _fill(template: str, facts: dict[str, Any]) -> str:
    def value(match: re.Match[str]) -> str:
        found = lookup(facts, match.group(1))
        if isinstance(found, list):
            return ", ".join(str(v) for v in found) or "none"
        return "unknown" if found is None else str(found)

    return _PLACEHOLDER.sub(value, template)


def diagnose(facts: dict[str, Any]) -> list[Finding]:
    """Every known issue whose conditions hold for ``facts``, highest severity first."""
    data = known_issues()
    try:
        return _diagnose(facts, data)
    except (AttributeError, TypeError, ValueError, KeyError, IndexError, ArithmeticError, RecursionError) as exc:
        # A facts file is someone else's JSON: a list where an object belongs must not be a traceback.
        shown = terminal_safe(exc)
        shown = shown if len(shown) <= 200 else shown[:197] + "..."
        raise InputError(f"facts have a value of the wrong type ({type(exc).__name__}: {shown})") from None


def _diagnose(facts: dict[str, Any], data: dict[str, Any]) -> list[Finding]:
    full = {**facts, "derived": derive(facts, data.get("tables", {}))}
    found = []
    for entry in data["issues"]:
        if all(_holds(full, cond) for cond in entry["when"]):
            found.append(
                Finding(
                    id=entry["id"],
                    title=entry["title"],
                    severity=entry["severity"],
                    detail=_fill(entry.get("detail", ""), full),
                    symptom=entry["symptom"],
                    fix=entry["fix"],
                    affected=entry["affected"],
                    sources=tuple(entry["sources"]),
                    evidence={p: lookup(full, p) for p in dict.fromkeys(_paths(entry["when"]))},
                )
            )
    rank = {"high": 0, "medium": 1, "low": 2}
    return sorted(found, key=lambda f: rank.get(f.severity, 3))
