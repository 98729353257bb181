"""``memwarden trace --live``'s screen: a running script's memory as one 80-column panel (rich).

Pure: the Trace made so far from the script's stream (``trace.stream.trace_from_stream``) in, a
renderable out. Shows what is alive now — by category and by modality, against the run's peak
so far — the phase the script is in, and the user lines holding the most live bytes.
"""

from __future__ import annotations

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from memwarden.analyze.analysis import Analysis
from memwarden.analyze.timeline import breakdown_at, live_blocks_at
from memwarden.trace.model import Phase, Trace, enum_name
from memwarden.units import format_bytes, format_us

__all__ = ["render_live"]

WIDTH = 80
_BAR = 24


def _bar(part: int, whole: int) -> Text:
    share = 0.0 if whole <= 0 else max(0.0, min(1.0, part / whole))
    filled = round(share * _BAR)
    return Text("█" * filled, style="cyan") + Text("·" * (_BAR - filled), style="dim")


def _short(line: str, width: int) -> str:
    return line if len(line) <= width else "..." + line[-(width - 3) :]


def render_live(trace: Trace, source: str, *, finished: bool = False, top: int = 5) -> RenderableType:
    """Live bytes now (by category and modality), the peak so far, the phase, the top lines."""
    n = trace.num_events
    state = "finished" if finished else "running"
    title = Text(_short(f"memwarden trace --live  {source}  ({state})", WIDTH), style="bold")
    if n == 0:
        return Group(title, Text("no allocation recorded yet", style="dim"))
    analysis = Analysis(trace)
    device = analysis.device
    live = analysis.live_bytes
    now_bytes, peak_bytes = int(live[-1]), int(live.max())
    phase = enum_name(Phase(int(trace.events["phase"][-1])))
    elapsed = int(trace.events["time_us"][-1] - trace.events["time_us"][0])
    head = Text(
        f"live {format_bytes(now_bytes)}  peak {format_bytes(peak_bytes)}  phase {phase}  "
        f"at {format_us(elapsed)}  events {n:,}"
    )
    table = Table(box=None, show_header=False, pad_edge=False, width=WIDTH)
    table.add_column(width=24, no_wrap=True)
    table.add_column(width=11, justify="right", no_wrap=True)
    table.add_column(width=WIDTH - 24 - 11 - 2, no_wrap=True)
    for by in ("category", "modality"):
        table.add_row(Text(f"by {by}", style="bold"), "", Text(""))
        parts = sorted(breakdown_at(trace, n - 1, by, device).items(), key=lambda kv: -kv[1])
        for label, nbytes in parts:
            if nbytes > 0:
                table.add_row(f"  {label}", format_bytes(nbytes), _bar(nbytes, peak_bytes))
    rows = live_blocks_at(trace, n - 1, device, analysis.free_index)
    lines = trace.events["line"][rows]
    parts_out: list[RenderableType] = [title, head, table]
    known = lines >= 0
    if known.any():
        keys, inverse = np.unique(lines[known], return_inverse=True)
        sums = np.bincount(inverse, weights=trace.events["nbytes"][rows][known].astype(np.float64))
        parts_out.append(Text("top lines (live now)", style="bold"))
        for i in np.argsort(-sums, kind="stable")[:top]:
            size = format_bytes(int(sums[i]))
            parts_out.append(Text(f"  {size:>10}  {_short(trace.strings[int(keys[i])], WIDTH - 14)}"))
    return Group(*parts_out)
