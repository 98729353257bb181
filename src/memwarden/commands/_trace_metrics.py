"""``memwarden trace --metrics-port PORT``: a traced script's memory as Prometheus metrics.

The supervisor runs the script as ``trace`` always does; this exporter answers each scrape of
``http://ADDR:PORT/metrics`` from the stream file the child appends to (flushed about every
100 ms), through ``prometheus_client`` (the server and the exposition are
``runtime.metrics.SessionMetrics``'s, with the stream in place of a session). A scrape reads the
stream only when it grew since the last one, so an idle or finished script costs one ``stat``
per scrape; a scrape of a growing stream costs one read of the stream so far (a few ms per
100,000 events), which Prometheus' 15 s interval makes small.

Metrics (prefixed ``memwarden_``; figures of the main device, as ``summary`` reports them):

==================================  =======  ============================================
trace_live_bytes{category}          gauge    live bytes now, per category (weight, ...)
trace_live_modality_bytes{modality} gauge    live bytes now, per modality (vision, text, ...)
trace_live_total_bytes              gauge    live bytes now
trace_peak_bytes                    gauge    the run's peak so far
trace_phase{phase}                  gauge    1 for the phase of the latest event
trace_events                        counter  allocation events recorded so far
trace_running                       gauge    1 while the script runs, 0 once it ended
==================================  =======  ============================================
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from memwarden.runtime.metrics import PREFIX, SessionMetrics

__all__ = ["StreamMetrics", "stream_figures"]


def stream_figures(path: Path) -> dict[str, Any] | None:
    """What a scrape reports, from the stream at ``path`` as it is now (None: nothing yet)."""
    from memwarden.analyze.analysis import Analysis
    from memwarden.analyze.timeline import breakdown_at
    from memwarden.trace.model import Phase, enum_name
    from memwarden.trace.stream import read_stream, trace_from_stream

    try:
        trace = trace_from_stream(read_stream(path.read_bytes()))
    except (OSError, ValueError):  # not created yet, or replaced by the complete trace
        return None
    n = trace.num_events
    if n == 0:
        return {"events": 0, "category": {}, "modality": {}, "live": 0, "peak": 0, "phase": None}
    analysis = Analysis(trace)
    live = analysis.live_bytes
    return {
        "events": n,
        "category": breakdown_at(trace, n - 1, "category", analysis.device),
        "modality": breakdown_at(trace, n - 1, "modality", analysis.device),
        "live": int(live[-1]),
        "peak": int(live.max()),
        "phase": enum_name(Phase(int(trace.events["phase"][-1]))),
    }


def _families(figures: dict[str, Any] | None, running: bool) -> Iterator[Metric]:
    yield GaugeMetricFamily(PREFIX + "trace_running", "1 while the traced script runs", value=int(running))
    if figures is None:
        return
    for by, name in (("category", "trace_live_bytes"), ("modality", "trace_live_modality_bytes")):
        family = GaugeMetricFamily(PREFIX + name, f"live bytes now, per {by}", labels=[by])
        for label, nbytes in sorted(figures[by].items()):
            family.add_metric([label], nbytes)
        yield family
    yield GaugeMetricFamily(PREFIX + "trace_live_total_bytes", "live bytes now", value=figures["live"])
    yield GaugeMetricFamily(PREFIX + "trace_peak_bytes", "the run's peak so far", value=figures["peak"])
    if figures["phase"] is not None:
        phase = GaugeMetricFamily(PREFIX + "trace_phase", "the phase of the latest event", labels=["phase"])
        phase.add_metric([figures["phase"]], 1)
        yield phase
    yield CounterMetricFamily(PREFIX + "trace_events", "allocation events recorded", value=figures["events"])


class StreamMetrics(SessionMetrics):
    """``SessionMetrics``' server and WSGI application over a growing stream file."""

    def __init__(self, path: Path) -> None:
        super().__init__(session=None)
        self.path = path
        self.running = True
        self._read: tuple[tuple[int, int], dict[str, Any] | None] | None = None

    def snapshot(self) -> Any:
        try:
            st = os.stat(self.path)
            grown = (st.st_size, st.st_mtime_ns)
        except OSError:
            grown = (-1, -1)
        if self._read is None or self._read[0] != grown:
            self._read = (grown, stream_figures(self.path))
        return (grown, self.running), self._read[1]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snap: Any = self._rendering or self.snapshot()  # ((size, mtime), running), figures
        (_grown, running), figures = snap
        yield from _families(figures, running)
