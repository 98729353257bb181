"""Pattern detectors over a Trace: Findings with evidence and a fix.

Each detector lives in ``analyze/patterns/<module>.py`` and is a pure function
``detect(ctx: Context) -> list[Finding]`` (``ctx.trace`` is the trace, ``ctx.analysis`` what is
computed once for all of them), listed in ``analyze/patterns.DETECTORS`` under the pattern id of
DESIGN.md. Thresholds are defaults a user can override from a TOML file
(``[thresholds.<pattern-id>]``); a finding whose fix saves a negligible share of the peak is dropped
here, in one place, and each finding's saving is computed here from its change.
"""

from __future__ import annotations

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.analyze.analysis import Analysis
from memwarden.analyze.counterfactual import Change, saving, union
from memwarden.analyze.finding import SEVERITIES, Context, Finding, severity_for
from memwarden.analyze.lines import INNER_FIRST, finding_lines
from memwarden.analyze.patterns import DETECTORS
from memwarden.analyze.source_lines import SourceLine, entry_files, read_from, script_files, script_line
from memwarden.analyze.thresholds import check_thresholds
from memwarden.analyze.timeline import live_blocks_at
from memwarden.analyze.value_flow import passed_keeper
from memwarden.trace.model import Trace
from memwarden.trace.sites import parse_line

# The pattern ids of DESIGN.md, in the order the detectors run (analyze/patterns/__init__.py).
PATTERNS: tuple[str, ...] = tuple(DETECTORS)

# A finding is reported when its fix lowers the peak by at least this share of it, or saves at
# least DEFAULT_MIN_WORK_PEAKS peaks' worth of allocation over the run (wasted work: time, churn),
# ranked after every finding that lowers the peak.
DEFAULT_MIN_WASTE_FRACTION = 0.01
DEFAULT_MIN_WORK_PEAKS = 0.05


def load_thresholds(path: str | Path) -> dict[str, dict[str, Any]]:
    """``[thresholds.<pattern>] name = value`` tables from a TOML file; clear ValueError otherwise."""
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    if unknown_keys := sorted(set(data) - {"thresholds"}):
        raise ValueError(f"unknown key(s) {unknown_keys}; a thresholds file holds [thresholds.<pattern-id>] tables")
    return check_thresholds(data.get("thresholds", {}))  # every name, type and range checked


def diagnose(
    trace: Trace | Analysis,
    thresholds: dict[str, dict[str, Any]] | None = None,
    patterns: list[str] | None = None,
    *,
    analysis: Analysis | None = None,
    budget_bytes: int | None = None,
) -> list[Finding]:
    """Run the detectors and return their findings, the largest saving at the peak first (those
    that save only work after them, ``rank``).

    ``trace``: a Trace, or its Analysis when the caller goes on to use it (a report), so nothing
    the detectors compute is computed again (``analysis=`` says the same, for earlier callers).
    ``budget_bytes``: the memory the run must fit in; a fix that makes it fit is high.
    """
    if isinstance(trace, Analysis):
        analysis = trace
        trace = analysis.trace
    ctx = Context(trace=trace, thresholds=thresholds or {}, shared=analysis)
    read_from(trace.metadata.get("cwd"))  # the script's relative source paths, for the line to change
    peak = ctx.summary.peak_bytes
    min_fraction = float(ctx.threshold("all", "min_waste_fraction", DEFAULT_MIN_WASTE_FRACTION))
    min_work = float(ctx.threshold("all", "min_work_peaks", DEFAULT_MIN_WORK_PEAKS))
    findings: list[Finding] = []
    changes: dict[int, Change] = {}  # id of a finding -> its change, for _same_bytes
    for pattern in patterns or list(PATTERNS):
        if pattern not in PATTERNS:
            raise ValueError(f"unknown pattern {pattern!r} (known: {', '.join(PATTERNS)})")
        for f in DETECTORS[pattern](ctx):
            change = f.change
            f = _with_saving(ctx, f, budget_bytes)
            if change is not None:
                changes[id(f)] = change
            # Negligible at the peak and not heavy over the run either: not reported. A finding whose
            # fix saves min_work_peaks of the peak in allocation stays, as the hint its severity says.
            if peak and f.saving_peak_bytes < min_fraction * peak and f.saving_allocated_bytes < min_work * peak:
                continue
            if not f.lines:
                f = replace(f, lines=finding_lines(trace, f.where, _live_at_peak(ctx), pattern=f.pattern))
            findings.append(f)
    findings = _in_the_script(ctx, _same_bytes(ctx, findings, changes))
    findings.sort(key=rank)
    return findings


# A generic reading of a run's growth, which a specific pattern may explain: the bytes a loop keeps
# (unbounded-growth) are often the graphs it keeps alive or the outputs it appends.
_GENERIC = frozenset({"unbounded-growth"})


def _same_bytes(ctx: Context, findings: list[Finding], changes: dict[int, Change]) -> list[Finding]:
    """A generic finding whose saving another finding already makes is the same cause read twice:
    applying both fixes saves little more than the other alone (under half of the generic one's own
    saving). It stays, as a low hint that names the other, so the cause is told once."""
    out = []
    for f in findings:
        mine = changes.get(id(f))
        if f.pattern in _GENERIC and mine is not None and f.severity != "low":
            for o in findings:
                theirs = changes.get(id(o))
                if o is f or o.pattern in _GENERIC or theirs is None or o.saving_peak_bytes < f.saving_peak_bytes:
                    continue
                both = saving(ctx.analysis, union(mine, theirs)).saving_peak_bytes
                if both < o.saving_peak_bytes + 0.5 * f.saving_peak_bytes:
                    f = replace(f, severity="low", evidence={**f.evidence, "same_bytes_as": o.pattern})
                    break
        out.append(f)
    return out


# Patterns whose fix is an argument of the script's call that builds (a dtype, the meta device, an
# mmap'd load): a helper module's line is followed up to that call, not to what keeps its result.
_BUILD_CALL = frozenset({"load-spike"})
# Patterns whose line is the one that keeps the bytes: followed into a function of the script the
# value is handed to (``stream.on_frame(i, frame)`` storing its parameter in ``self.history``).
_KEPT = frozenset({"unbounded-growth", "retained-outputs"})


def _in_the_script(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """Each finding's first line in the script the user ran: a line of a helper module the script
    imports (``_common.py``, ``utils.py``: it makes what it is asked for) is followed up to the
    script's statement that asks for it (``source_lines.script_line``), which then comes first.
    Patterns whose fix lies inside the code that allocated (``INNER_FIRST``: a concatenated cache in
    the user's model file) keep their lines."""
    if not findings:
        return findings  # nothing to place: no source is read
    # the user's files: those of the model calls, of the findings' lines and of every line that
    # allocated (a run without model calls, a script whose own lines made arrays)
    lines = ctx.trace.events["line"]
    made = [parse_line(ctx.trace.strings[int(i)]).file for i in np.unique(lines[lines >= 0]).tolist()]
    files = script_files([s.call_site or "" for s in ctx.analysis.steps])
    files += [str(x["file"]) for f in findings for x in f.lines[:1]] + made
    files = list(dict.fromkeys(f for f in files if f))
    script = ctx.trace.metadata.get("script")
    entries = entry_files(files, script if isinstance(script, str) else None)
    out = []
    for f in findings:
        first = f.lines[0] if f.lines else None
        if first is not None and (f.pattern not in INNER_FIRST or f.pattern in _BUILD_CALL):
            hold = f.pattern not in _BUILD_CALL
            up = script_line(str(first["file"]), int(first["line"]), entries, hold=hold)
            if f.pattern in _KEPT and (up is not None or str(first["file"]) in entries):
                at = up or SourceLine(str(first["file"]), int(first["line"]), "")
                up = passed_keeper(at.file, at.line) or up  # handed to a method that stores it
            if up is not None:
                moved = [x for x in f.lines if (x["file"], x["line"]) != (up.file, up.line)]
                f = replace(f, lines=[{"file": up.file, "line": up.line, "nbytes": first["nbytes"]}, *moved][:3])
        out.append(f)
    return out


def rank(f: Finding) -> tuple[int, int, int, int, int, str]:
    """Findings that lower the peak first, by how much; those that only save work after them. A
    predicted saving (another run's, ``Finding.predicted``) comes after the measured ones."""
    return (
        f.saving_peak_bytes <= 0,
        f.predicted,
        -f.saving_peak_bytes,
        SEVERITIES.index(f.severity),
        -f.saving_allocated_bytes,
        f.pattern,
    )


def _with_saving(ctx: Context, f: Finding, budget_bytes: int | None) -> Finding:
    """The finding with its counterfactual computed and its severity following the saving: against
    the peak (high >= 20%, medium >= 5%), and against the budget when one is given (a fix that
    turns "does not fit" into "fits" is high). A detector may only lower the severity (a hint it
    knows to be bounded); a fix that saves nothing at the peak is never more than low."""
    peak = ctx.summary.peak_bytes
    if f.change is not None:
        s = saving(ctx.analysis, f.change)
        peak_saving, allocated = s.saving_peak_bytes, s.saving_allocated_bytes
    else:  # a detector that measured its fix itself (a meta re-run)
        peak_saving, allocated = max(0, f.saving_peak_bytes), max(0, f.saving_allocated_bytes)
    severity = max(severity_for(peak_saving, peak), f.severity, key=SEVERITIES.index)
    if budget_bytes is not None and peak > budget_bytes >= peak - peak_saving and peak_saving > 0:
        severity = "high"  # the fix turns "does not fit" into "fits": nothing matters more
    return replace(
        f,
        severity=severity,
        saving_peak_bytes=int(peak_saving),
        saving_allocated_bytes=int(allocated),
        peak_added_bytes=int(peak_saving),
        allocated_bytes=int(allocated),
        change=None,
    )


def _live_at_peak(ctx: Context) -> np.ndarray:
    a = ctx.analysis
    if not a.trace.num_events:
        return np.zeros(0, np.int64)
    return live_blocks_at(a.trace, int(np.argmax(a.live_bytes)), a.device, a.free_index)


def report_json(analysis: Analysis, findings: list[Finding]) -> dict[str, Any]:
    """``diagnose --json``: the peak and the findings."""
    return {"peak_bytes": analysis.summary.peak_bytes, "findings": [f.to_json() for f in findings]}
