"""The budget walked from the command line to the placement (issue 40: one shape for a budget).

``memwarden demo --budget 48MiB`` reads the string once (``commands._common.bytes_option``, the
CLI's one reader of a byte-size option) and hands the API bytes; ``GovernedSession`` turns those
into one :class:`Budget` at its door (``Budget.parse``, once); the session's memory asks that
Budget for the bytes in force and, when the weights stream, the planner (``plan.placement.place``)
gets exactly the admissible share of them. On the way no string is parsed again, no figure is a
"no limit" sentinel (``2**62``) and no code on the path looks up an attribute of its own object
that may not exist yet (``getattr(self, "x", d)``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import memwarden
import memwarden.demo
from memwarden import cli, units
from memwarden.govern import budget_value
from memwarden.govern.budget_value import Budget
from memwarden.models import zoo
from memwarden.plan.placement import Placement
from memwarden.runtime import offload_plan, session_config
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.session_config import SessionConfig

MiB = 1 << 20
SRC = Path(memwarden.__file__).resolve().parent
# Every package a budget passes through between the command line and the placement.
ON_THE_PATH = ("commands", "govern", "runtime", "plan")


class _Stop(Exception):
    """Ends the demo command once it has built its config: the walk goes on through the API."""


def test_the_budget_flows_as_one_value_from_the_cli_to_the_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed_strings: list[str] = []
    real_parse_bytes = units.parse_bytes

    def counting_parse_bytes(text: object) -> int:
        if isinstance(text, str):
            parsed_strings.append(text)
        return real_parse_bytes(text)

    # bytes_option imports parse_bytes when it runs; the budget's own modules bound it at import
    for module in (units, budget_value, session_config):
        monkeypatch.setattr(module, "parse_bytes", counting_parse_bytes)
    budgets_parsed: list[object] = []
    real_parse = Budget.parse.__func__  # type: ignore[attr-defined]

    def counting_parse(cls: type[Budget], budget: Any, cap: Any = None) -> Budget:
        budgets_parsed.append(budget)
        return real_parse(cls, budget, cap)  # type: ignore[no-any-return]

    monkeypatch.setattr(Budget, "parse", classmethod(counting_parse))
    placed: list[Placement] = []
    real_place = offload_plan.place

    def recording_place(*args: Any, **kwargs: Any) -> Placement:
        placement = real_place(*args, **kwargs)
        placed.append(placement)
        return placement

    monkeypatch.setattr(offload_plan, "place", recording_place)
    configs: list[Any] = []

    def stop_at_the_api(config: Any, out: Any, **kwargs: Any) -> Any:
        configs.append(config)
        raise _Stop

    monkeypatch.setattr(memwarden.demo, "run_demo", stop_at_the_api)

    # the door: the command line
    with pytest.raises(_Stop):
        cli.main(["demo", "--budget", "48MiB", "--model", "llava", "--size", "tiny", "--no-real-limit", "--quiet"])
    assert parsed_strings == ["48MiB"]  # read once, by the command
    (demo_config,) = configs
    assert type(demo_config.budget_bytes) is int and demo_config.budget_bytes == 48 * MiB

    # the API, as the demo calls it (demo.py: GovernedSession(model, config.budget_bytes, ...)),
    # with the weights streamed so that the budget reaches the placement
    model = zoo.build_model("llava", "tiny")
    session = GovernedSession(model, demo_config.budget_bytes, config=SessionConfig(stream=True, encoder_cache=False))
    try:
        assert budgets_parsed == [48 * MiB]  # one Budget, made once at the session's door
        memory = session.memory
        assert memory.budget == Budget(fixed_bytes=48 * MiB)
        assert parsed_strings == ["48MiB"]  # nothing on the way parsed a string again
        in_force = memory.budget.bytes_now(memory.limit_bytes)
        assert memory.budget_bytes == session.budget_bytes == in_force <= 48 * MiB
        (placement,) = placed  # the planner saw the budget once, as the admissible share of it
        assert session.streamer is not None and session.streamer.placement is placement
        assert placement.budget_bytes == memory.admissible(in_force) < in_force
        figures = [demo_config.budget_bytes, in_force, placement.budget_bytes, memory.initial_budget]
        assert all(0 < f <= 48 * MiB for f in figures)  # no "no limit" sentinel anywhere on the way
    finally:
        session.close()


def _own_attribute_lookups(text: str, where: str) -> list[str]:
    """``getattr(self, "name", ...)`` / ``hasattr(self, "name")``: an object asking whether it has
    been built far enough yet, which building it in phases, in order, makes unnecessary."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "self"
            and isinstance(node.args[1], ast.Constant)
        ):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_sentinel_and_no_late_attribute_lookup_on_the_budgets_path() -> None:
    sentinels, lookups = [], []
    for package in ON_THE_PATH:
        for path in sorted((SRC / package).rglob("*.py")):
            text, where = path.read_text(), str(path.relative_to(SRC))
            for number, line in enumerate(text.splitlines(), 1):
                bare = line.replace(" ", "")
                if "budget" in line.lower() and ("2**62" in bare or "1<<62" in bare):
                    sentinels.append(f"{where}:{number}")
            lookups += _own_attribute_lookups(text, where)
    assert sentinels == []
    assert lookups == []


def test_the_lookup_check_sees_what_it_is_about() -> None:
    code = 'class A:\n    def f(self, name):\n        return getattr(self, "limit_bytes", None), getattr(self, name)\n'
    assert _own_attribute_lookups(code, "a.py") == ["a.py:3: getattr(self, 'limit_bytes', None)"]
