"""Limit checks and baseline comparisons as text: ``memwarden check`` and the pytest plugin.

Pure: outcomes and deltas in, lines of at most 80 columns out. A breach is one line (what a CI log
greps for); the explanation under it (the lines holding the bytes, the finding that applies, the
deltas) is separate so that a caller can put it elsewhere.
"""

from __future__ import annotations

from memwarden.analyze.baseline import Comparison, Delta
from memwarden.analyze.check import Outcome
from memwarden.analyze.finding import Finding
from memwarden.units import format_bytes

__all__ = ["breach_line", "explain_outcome", "growth_line", "growth_lines", "render_deltas"]

WIDTH = 80


def _fit(text: str, width: int = WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _short_line(line: str, width: int) -> str:
    """``/long/path/to/file.py:12:fn`` keeps its tail (file, line, function), which says most."""
    return line if len(line) <= width else "..." + line[-(width - 3) :]


def breach_line(outcome: Outcome) -> str:
    return f"memory limit exceeded: {outcome.message()}"


def explain_outcome(outcome: Outcome, findings: list[Finding] | None = None) -> list[str]:
    """The lines under a breach: the top source lines holding the figure, then the finding that
    concerns it (the heaviest of ``findings`` in the limit's modality or phase, else the heaviest)."""
    out: list[str] = []
    when = "at the peak" if outcome.limit.measure == "peak" else "over the run"
    if outcome.top_lines:
        out.append(f"  top lines {when}:")
        for entry in outcome.top_lines:
            size = format_bytes(entry.nbytes)
            out.append(f"    {size:>10}  {_short_line(entry.line, WIDTH - 16)}")
    finding = _relevant(outcome, findings or [])
    if finding is not None:
        out.append(_fit(f"  finding: {finding.pattern} ({finding.severity}) at {finding.where}"))
        out.append(_fit(f"  fix: {finding.fix}"))
    return out


def _relevant(outcome: Outcome, findings: list[Finding]) -> Finding | None:
    if not findings:
        return None
    words = [w for w in (outcome.limit.modality, outcome.limit.phase, outcome.limit.category) if w]
    matching = [f for f in findings if any(w in f"{f.where} {f.evidence}" for w in words)] if words else []
    return max(matching or findings, key=lambda f: f.wasted_bytes)


def _growth_text(delta: Delta) -> str:
    growth = delta.growth
    return "new" if growth == float("inf") else f"{100 * growth:+.1f}%"


def growth_line(delta: Delta, max_growth: float) -> str:
    """``memory grew: phase prefill 1.3 MiB -> 2.6 MiB (+108.0%, limit +5.0%)``."""
    text = (
        f"memory grew: {delta.name} {format_bytes(delta.old_bytes)} -> {format_bytes(delta.new_bytes)}"
        f" ({_growth_text(delta)}, limit +{100 * max_growth:.1f}%)"
    )
    return _fit(text, 200)  # a module path can be long; a CI log wraps, a truncated name misleads


def growth_lines(grown: list[Delta], max_growth: float, most_modules: int = 10) -> list[str]:
    """One line per breach, except that modules past the ``most_modules`` that grew most by bytes
    are counted on one line: a larger image grows every layer of the tower at once, and fifty
    lines would bury the phase lines that say where it matters."""
    modules = sorted((d for d in grown if d.kind == "module"), key=lambda d: -d.delta_bytes)
    shown = [d for d in grown if d.kind != "module"] + modules[:most_modules]
    out = [growth_line(d, max_growth) for d in shown]
    if len(modules) > most_modules:
        out.append(
            f"memory grew: {len(modules) - most_modules} more modules past +{100 * max_growth:.1f}% (see --json)"
        )
    return out


def render_deltas(
    comparison: Comparison, kinds: tuple[str, ...] = ("category", "modality", "line"), top: int = 5
) -> list[str]:
    """Per kind, the figures that changed most (by absolute bytes), one table row each."""
    out: list[str] = []
    for kind in kinds:
        changed = [d for d in comparison.of(kind) if d.delta_bytes != 0]
        if not changed:
            continue
        changed.sort(key=lambda d: -abs(d.delta_bytes))
        out.append(f"by {kind}:{'':<{34 - len(kind)}}{'baseline':>11}{'now':>11}{'delta':>11}{'':>9}")
        for d in changed[:top]:
            key = _short_line(d.key, 35) if kind == "line" else _fit(d.key, 35)
            delta = ("+" if d.delta_bytes > 0 else "") + format_bytes(d.delta_bytes)
            out.append(
                f"  {key:<36}{format_bytes(d.old_bytes):>11}{format_bytes(d.new_bytes):>11}"
                f"{delta:>11}{_growth_text(d):>9}"
            )
    return out
