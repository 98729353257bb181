"""What a detector returns and what it is given: a ``Finding`` (a pattern named with its evidence,
its fix and the fix as a change to the run) and a ``Context`` (the trace's shared ``Analysis`` and
the user's thresholds). Detectors (``analyze/patterns``) import these; ``diagnose`` runs them."""

from __future__ import annotations

from dataclasses import InitVar, asdict, dataclass, field, replace
from typing import Any

from memwarden.analyze.analysis import Analysis
from memwarden.analyze.counterfactual import Change
from memwarden.analyze.timeline import Summary
from memwarden.trace.model import Trace

__all__ = ["SEVERITIES", "Context", "Finding", "severity_for"]

SEVERITIES = ("high", "medium", "low")


@dataclass(frozen=True, kw_only=True)
class Finding:
    pattern: str
    severity: str  # high | medium | low
    bytes_at_peak: int  # bytes this pattern holds at the trace's peak
    wasted_bytes: int  # bytes the fix removes (peak, reserved, or repeated work, as evidence says)
    where: str  # module path / op
    evidence: dict[str, Any]  # the numbers that prove it
    fix: str  # a concrete change, naming the setting or memwarden feature, with the predicted saving
    # The same numbers as saving_peak_bytes / saving_allocated_bytes (set by diagnose()), kept under
    # their earlier names for users' code that reads them.
    peak_added_bytes: int = 0
    allocated_bytes: int = 0
    # The lines of the user's code the evidence came from, heaviest first: {file, line, nbytes}.
    # A detector that knows them sets them; otherwise diagnose() finds them from ``where``.
    lines: list[dict[str, Any]] = field(default_factory=list)
    # The fix as a counterfactual, computed by diagnose() from ``change`` (the trace replayed with
    # the fix applied, analyze/counterfactual.py) or given by a detector that re-ran the step:
    # how much lower the peak would be, and the bytes the fixed run no longer allocates.
    saving_peak_bytes: int = 0
    saving_allocated_bytes: int = 0
    # The saving is a prediction for another run, not the traced one's (a CPU trace's fragmentation
    # replayed through the CUDA caching-allocator model): never headlined over a measured saving.
    predicted: bool = False
    change: Change | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        out = asdict(replace(self, change=None))
        del out["change"]  # the replay's input, not a result
        del out["predicted"]  # how the findings are ranked; the evidence says it in words ("note")
        return out


@dataclass
class Context:
    """What every detector may need: the trace's shared ``Analysis`` (summary, device, free index,
    steps, replays, each computed once for all detectors and the report) and the user's thresholds.

    ``shared``: an Analysis already built for ``trace`` (the report's); without one, one is made.
    """

    trace: Trace
    thresholds: dict[str, dict[str, Any]] = field(default_factory=dict)
    shared: InitVar[Analysis | None] = None
    analysis: Analysis = field(init=False)

    def __post_init__(self, shared: Analysis | None) -> None:
        if shared is not None and shared.trace is not self.trace:
            raise ValueError("the Analysis given belongs to another trace")
        self.analysis = shared if shared is not None else Analysis(self.trace)

    @property
    def summary(self) -> Summary:
        return self.analysis.summary

    def threshold(self, pattern: str, name: str, default: Any) -> Any:
        return self.thresholds.get(pattern, {}).get(name, default)


def severity_for(wasted_bytes: int, peak_bytes: int, high: float = 0.2, medium: float = 0.05) -> str:
    """high when the waste is >= 20% of the peak, medium >= 5%, else low (defaults)."""
    share = wasted_bytes / peak_bytes if peak_bytes else 0.0
    return "high" if share >= high else "medium" if share >= medium else "low"
