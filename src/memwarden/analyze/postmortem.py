"""What ``memwarden trace`` prints when the traced script dies of memory: a few lines on stderr,
before the user opens anything.

A run died of memory when its trace says so, on evidence: ``metadata.failure`` (a ``MemoryError``
or ``torch.OutOfMemoryError`` propagated) or ``metadata.oom_killed`` true (the kernel's or the
cgroup's OOM counters moved). A signal after the resident size grew (the last resident sample at
least 1.5x the first and the run's highest) is called a likely OOM only where the counters could not
be read (``oom_killed`` None); where they were read and did not move, the run was killed by that
signal, not by the OOM killer, and ``killed_lines`` says so.
"""

from __future__ import annotations

import signal
from typing import Any

from memwarden.analyze.diagnose import diagnose
from memwarden.analyze.timeline import summary
from memwarden.trace.model import Trace
from memwarden.units import format_bytes

__all__ = ["died_of_memory", "failure_lines", "killed_lines"]


def _resident_grew(meta: dict[str, Any]) -> bool:
    rss = [r for r in (meta.get("resident") or {}).get("samples", {}).get("rss", []) if r]
    return len(rss) >= 2 and rss[-1] >= 1.5 * rss[0] and rss[-1] >= 0.9 * max(rss)


def died_of_memory(trace: Trace) -> str | None:
    """Why the run is taken to have died of memory, or None."""
    meta = trace.metadata
    failure = meta.get("failure")
    if isinstance(failure, dict):
        return f"{failure.get('kind', 'MemoryError')}: {failure.get('message', '')}".rstrip(": ")
    sig = meta.get("exit_signal")
    name = signal.Signals(sig).name if isinstance(sig, int) and sig in signal.Signals._value2member_map_ else sig
    if meta.get("oom_killed") is True:
        return f"{name} from the kernel's OOM killer"
    if sig is not None and meta.get("oom_killed") is None and _resident_grew(meta):
        return f"{name} after resident memory grew; the kernel's OOM counters could not be read"
    return None


def killed_lines(trace: Trace) -> list[str]:
    """One line for a run a signal ended that did not die of memory (a hand ``kill -9``, a watchdog,
    a segfault): which signal, and that the OOM counters say it was not the OOM killer."""
    meta = trace.metadata
    sig = meta.get("exit_signal")
    if sig is None or died_of_memory(trace) is not None:
        return []
    name = signal.Signals(sig).name if isinstance(sig, int) and sig in signal.Signals._value2member_map_ else sig
    evidence = meta.get("oom_evidence")
    parts = []
    if meta.get("oom_killed") is False:  # where the supervisor looked (record/live/oom.py)
        parts.append(
            f"no OOM kill in the {evidence}" if isinstance(evidence, str) else "the kernel's OOM counters did not move"
        )
    rss = [r for r in (meta.get("resident") or {}).get("samples", {}).get("rss", []) if r]
    if len(rss) >= 2 and not _resident_grew(meta):
        parts.append("resident memory was flat")
    why = "; ".join(parts) or "no memory error"
    return [f"memwarden: the script was killed by signal {sig} ({name}), not by the OOM killer ({why})"]


def _top(items: dict[str, int], n: int = 4) -> str:
    parts = sorted(((v, k) for k, v in items.items() if v > 0), reverse=True)[:n]
    return ", ".join(f"{k} {format_bytes(v)}" for v, k in parts) or "nothing"


def failure_lines(trace: Trace) -> list[str]:
    """The explanation (empty when the run did not die of memory)."""
    cause = died_of_memory(trace)
    if cause is None:
        return []
    s = summary(trace)
    lines = [f"memwarden: the script died of memory ({cause}); traced peak {format_bytes(s.peak_bytes)}"]
    resident = trace.metadata.get("resident") or {}
    if resident.get("last_bytes"):
        lines[0] += f", last resident size {format_bytes(int(resident['last_bytes']))}"
    lines.append(f"  alive at the peak by category: {_top(s.by_category_at_peak)}")
    lines.append(f"  by modality: {_top(s.by_modality_at_peak)}")
    for site in s.top_sites_at_peak[:3]:
        lines.append(f"  held by {site.module or '(no module)'} {site.op or ''}: {format_bytes(site.nbytes)}".rstrip())
    for src in s.top_lines_at_peak[:3]:  # where in the user's code
        lines.append(f"  held by line {src.file}:{src.line} ({src.function}): {format_bytes(src.nbytes)}")
    try:
        findings = diagnose(trace)
    except Exception:  # a torn trace must not hide the lines above
        findings = []
    if findings:
        f = findings[0]
        lines.append(f"  cause: {f.pattern} at {f.where}: {f.fix}")
    return lines
