"""``memwarden trace --live``: the supervised run of ``trace``, with its stream drawn as it grows.

The supervisor (main thread: it installs signal handlers) runs the script exactly as ``trace``
does; a viewer thread reads the stream file the child appends to, about once a second, and redraws
(``report.live``). The script's own output shares the terminal and scrolls above the panel.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

__all__ = ["run_live"]


def _snapshot(path: Path) -> Any:
    """The Trace of the stream so far, or None while there is none to read (not started yet)."""
    from memwarden.trace.stream import read_stream, trace_from_stream

    try:
        data = path.read_bytes()
        return trace_from_stream(read_stream(data))
    except (OSError, ValueError):  # not created yet, or already replaced by the complete trace
        return None


def run_live(out: Path, *, script: str, args: list[str], options: dict[str, Any], interval_s: float = 1.0) -> Any:
    """Supervise the script with the live panel; returns the ``SupervisedRun``."""
    from rich.console import Console
    from rich.live import Live

    from memwarden.record.live.supervisor import supervise
    from memwarden.report.live import render_live
    from memwarden.trace.model import TraceBuilder

    console = Console(width=min(80, Console().width), stderr=True)
    done = threading.Event()
    empty = TraceBuilder().build()
    with Live(render_live(empty, script), console=console, auto_refresh=False) as live:

        def view() -> None:
            while not done.wait(interval_s):
                trace = _snapshot(out)
                if trace is not None:
                    live.update(render_live(trace, script), refresh=True)

        viewer = threading.Thread(target=view, name="memwarden-live-view", daemon=True)
        viewer.start()
        try:
            run = supervise(out, script=script, args=args, options=options)
        finally:
            done.set()
            viewer.join()
        live.update(render_live(run.trace, script, finished=True), refresh=True)
    return run
