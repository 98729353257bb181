"""The pytest plugin: memory limits as tests.

- ``@pytest.mark.memwarden(peak="1.5 GiB", phase="prefill", modality="vision")`` captures the
  test's call (``memwarden.capture()``) and fails the test when the figure breaks the limit. The
  keywords: ``peak`` and/or ``allocated`` (byte quantities), and a scope: ``phase``, ``modality``,
  ``category`` (see ``memwarden.analyze.check``). Positional strings add limits in the form
  ``memwarden check --max`` takes (``"prefill=1.2GiB"``, ``"allocated:vision=3GiB"``). Several
  markers add up.
- The ``memwarden_limits`` fixture, for finer control: ``with memwarden_limits.watch(peak="2 MiB",
  phase="prefill"):`` checks only the block (model construction left out) when it ends, and
  ``memwarden_limits.trace`` is the block's trace for further assertions.
- ``--memwarden-traces DIR`` keeps the trace of every breach in DIR, one file per test, named after
  the test id (so xdist workers never write the same file).

A breach fails the test (not an error in set-up or teardown) with a short explanation: the limit,
the measured figure, the user lines that hold the bytes and the finding that applies, if any.
Fixtures run before the capture starts, so what they built counts as alive from the start.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from memwarden.analyze.analysis import Analysis
from memwarden.analyze.check import CheckResult, Limit, check_limits, parse_limit, parse_scope
from memwarden.analyze.diagnose import diagnose
from memwarden.record.api import capture
from memwarden.report.check import breach_line, explain_outcome
from memwarden.trace.io import save
from memwarden.trace.model import Trace
from memwarden.units import parse_bytes

__all__ = ["MemoryLimits", "limits_from_marker"]

_MARKER_HELP = (
    "memwarden(*limits, peak=None, allocated=None, phase=None, modality=None, category=None): fail the "
    "test when its memory breaks a limit (sizes such as '1.5 GiB'; limits such as 'prefill=1.2GiB')"
)
_SCOPE_KEYS = ("phase", "modality", "category")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memwarden", "memory limits (memwarden)")
    group.addoption(
        "--memwarden-traces",
        metavar="DIR",
        default=None,
        help="keep the .mwtrace of every test that breaks a memory limit in DIR",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _MARKER_HELP)
    directory = config.getoption("memwarden_traces", None)
    if directory:  # one clear error at start-up, not a FileExistsError in the first test that breaches
        path = Path(directory)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            what = "exists and is not a directory" if path.exists() else (exc.strerror or type(exc).__name__)
            raise pytest.UsageError(f"--memwarden-traces {directory}: {what}") from None


def limits_from_marker(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[Limit]:
    """The limits one ``memwarden`` marker sets. Raises ValueError/TypeError on a bad one."""
    unknown = set(kwargs) - {"peak", "allocated", *_SCOPE_KEYS}
    if unknown:
        raise TypeError(
            f"unknown keyword(s) {', '.join(sorted(unknown))} (valid: peak, allocated, {', '.join(_SCOPE_KEYS)})"
        )
    scope: dict[str, str] = {}
    for key in _SCOPE_KEYS:
        if kwargs.get(key) is not None:
            found = parse_scope(f"{key}:{kwargs[key]}")
            scope[key] = found[key]
    limits = [parse_limit(str(text)) for text in args]
    for measure in ("peak", "allocated"):
        if kwargs.get(measure) is not None:
            try:
                max_bytes = parse_bytes(kwargs[measure])
            except ArithmeticError:  # Fraction(10**400), Decimal('1e999'): float() overflows
                shown = repr(kwargs[measure])
                shown = shown if len(shown) <= 40 else shown[:37] + "..."
                raise ValueError(f"{measure}={shown}: out of range (0 to 2**62 bytes)") from None
            limits.append(Limit(max_bytes=max_bytes, measure=measure, **scope))
    if not limits:
        raise TypeError("no limit: give peak=..., allocated=... or a limit such as 'prefill=1.2GiB'")
    return limits


def _trace_path(directory: str, nodeid: str, suffix: str = "") -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:180] or "test"
    return Path(directory) / f"{name}{suffix}.mwtrace"


def _explain(trace: Trace, result: CheckResult, kept: Path | None) -> str:
    """The failure text: one line per breach, each with its lines and finding; where the trace is."""
    analysis = Analysis(trace)
    try:
        findings = diagnose(trace, analysis=analysis)
    except Exception:  # a detector's trouble must not hide the breach itself
        findings = []
    lines: list[str] = []
    for outcome in result.breaches:
        lines.append(breach_line(outcome))
        lines.extend(explain_outcome(outcome, findings))
    lines.append(f"trace kept: {kept}" if kept else "keep the trace with --memwarden-traces DIR")
    return "\n".join(lines)


def _verdict(config: pytest.Config, nodeid: str, trace: Trace, limits: list[Limit], suffix: str = "") -> None:
    """Fail the running test (``pytest.fail``) when ``trace`` breaks one of ``limits``."""
    result = check_limits(trace, limits)
    if result.ok:
        return
    directory = config.getoption("memwarden_traces")
    kept = None
    if directory:
        kept = _trace_path(str(directory), nodeid, suffix)
        kept.parent.mkdir(parents=True, exist_ok=True)
        save(trace, kept)
    pytest.fail(_explain(trace, result, kept), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    marks = list(item.iter_markers("memwarden"))
    if not marks:
        return (yield)
    try:
        limits = [limit for mark in marks for limit in limits_from_marker(mark.args, mark.kwargs)]
    except (TypeError, ValueError, ArithmeticError) as exc:  # the test's own mistake: fail it, run the others
        error = f"@pytest.mark.memwarden: {exc}"
    else:
        error = ""
    if error:  # outside the except block: one line, not the parse error chained above it
        pytest.fail(error, pytrace=False)
    cap = capture()
    with cap:
        result = yield
    assert cap.trace is not None
    _verdict(item.config, item.nodeid, cap.trace, limits)
    return result


class MemoryLimits:
    """The ``memwarden_limits`` fixture: limits on blocks of a test rather than its whole call."""

    def __init__(self, config: pytest.Config, nodeid: str) -> None:
        self._config = config
        self._nodeid = nodeid
        self._blocks = 0
        self.trace: Trace | None = None  # the last watched block's trace

    @contextmanager
    def watch(self, *limits: str, **kwargs: Any) -> Iterator[MemoryLimits]:
        """Capture the block; when it ends, fail the test if it broke a limit (the marker's
        arguments). Usable several times in one test; each block is checked on its own."""
        checked = limits_from_marker(limits, kwargs)
        self._blocks += 1
        cap = capture()
        with cap:
            yield self
        assert cap.trace is not None
        self.trace = cap.trace
        _verdict(self._config, self._nodeid, cap.trace, checked, suffix=f"-block{self._blocks}")

    def check(self, trace: Trace, *limits: str, **kwargs: Any) -> CheckResult:
        """Measure ``limits`` against any trace without failing: the outcomes, for assertions."""
        return check_limits(trace, limits_from_marker(limits, kwargs))


@pytest.fixture
def memwarden_limits(request: pytest.FixtureRequest) -> MemoryLimits:
    return MemoryLimits(request.config, request.node.nodeid)
