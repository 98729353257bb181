"""What exposing a GovernedSession's metrics costs: one scrape, and scrapes per request served.

    .venv/bin/python benchmarks/bench_metrics.py [REQUESTS]

Serves REQUESTS requests of the tiny llava zoo model under a 1 GiB budget while a scraper thread,
every 100 ms (Prometheus' usual interval is 15 s: this is 150x denser), answers one scrape three
ways side by side (in rotating order, each through prometheus_client's WSGI application, which is
what the HTTP server runs for a scrape), then fetches /metrics over 127.0.0.1:

- ``exporter``: ``SessionMetrics.app`` as served: one ``stats(include_requests=False)`` (the
  session's running counts, ``runtime/session_tally.py``), and the exposition formatted again only
  when the session changed since the last scrape;
- ``counts``: the same counts, formatted at every scrape (no reuse of the last exposition);
- ``lists``: what every scrape did before the running counts: ``stats()`` with its lists of every
  event and request, the decisions, refusals and log entries counted again over those lists, and
  the exposition formatted.

Reports each way's time for one scrape at the start and after every request was served, and per
request served, with the ratios to the exporter. Times are the scraper thread's CPU time
(``time.thread_time``): what a scrape takes from the service; the wall time around the same calls
is shown too, which on a loaded machine also counts waiting for a core or for the GIL.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import torch
from prometheus_client.core import Metric
from prometheus_client.exposition import make_wsgi_app
from prometheus_client.registry import Collector, CollectorRegistry

from memwarden.models import zoo
from memwarden.runtime.metrics import SessionMetrics, families, serve_metrics, streamed_weight_bytes
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.session_tally import SessionTally

_ENVIRON = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "", "HTTP_ACCEPT": "text/plain"}


class _Listing(Collector):
    """The exposition as scrapes built it before the running counts: from the full lists."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        stats = self.session.stats()  # every event and every request's record, as JSON
        counts, _, _ = SessionTally().look(self.session.records, self.session.events)  # counted from scratch
        yield from families({**stats, **counts}, streamed_weight_bytes(self.session))


def _scrape(app: Callable[..., Any]) -> bytes:
    return b"".join(app(dict(_ENVIRON), lambda status, headers, exc_info=None: None))


def _one_ms(app: Callable[..., Any], repeat: int = 50) -> float:
    """Median CPU time of one scrape answered by ``app``, ms (the session unchanged between them)."""
    times = []
    for _ in range(repeat):
        t = time.thread_time()
        _scrape(app)
        times.append(time.thread_time() - t)
    return 1000 * statistics.median(times)


def main(requests: int = 100) -> None:
    model = zoo.build_model("llava")
    inputs = zoo.make_inputs(model, prompt_tokens=24)
    with GovernedSession(model, "1GiB") as session:
        metrics = serve_metrics(session, 0)  # the served endpoint, fetched over HTTP at each tick
        exporter = SessionMetrics(session)  # the same exporter, asked in process: its reuse sees only these scrapes
        apps = {
            "exporter": exporter.app,
            "counts": make_wsgi_app(exporter.registry),
            "lists": make_wsgi_app(_Listing(session).registry),
        }
        assert len({_scrape(app) for app in apps.values()}) == 1  # three ways, one exposition
        first = {name: _one_ms(app) for name, app in apps.items()}
        stop = threading.Event()
        cpu_s: dict[str, list[float]] = {name: [] for name in apps}
        wall_s: dict[str, list[float]] = {name: [] for name in apps}

        def scraper() -> None:
            tick = 0
            names = list(apps)
            while not stop.wait(0.1):
                for name in names[tick % 3 :] + names[: tick % 3]:  # the same moment of the session, each way
                    t, cpu = time.perf_counter(), time.thread_time()
                    _scrape(apps[name])
                    cpu_s[name].append(time.thread_time() - cpu)
                    wall_s[name].append(time.perf_counter() - t)
                with urllib.request.urlopen(metrics.url, timeout=30) as r:
                    r.read()
                tick += 1

        thread = threading.Thread(target=scraper)
        thread.start()
        start = time.perf_counter()
        with torch.inference_mode():
            for _ in range(requests):
                session.generate(**inputs, max_new_tokens=3, **zoo.generate_kwargs("llava"))
        wall = time.perf_counter() - start
        stop.set()
        thread.join()
        last = {name: _one_ms(app) for name, app in apps.items()}
        metrics.stop()
    per_request = {name: 1000 * sum(times) / requests for name, times in cpu_s.items()}
    per_request_wall = {name: 1000 * sum(times) / requests for name, times in wall_s.items()}
    print(f"requests {requests} in {wall:.2f} s; scrapes {len(cpu_s['exporter'])} (every 100 ms)")
    print(f"{'':36}{'exporter':>9}{'counts':>9}{'lists':>9}{'counts/exp':>12}{'lists/exp':>11}")
    for label, figures in (
        ("one scrape at 0 requests, ms", first),
        (f"one scrape at {requests} requests, ms", last),
        ("scrapes per request served, ms", per_request),
        ("  (wall time, same scrapes), ms", per_request_wall),
    ):
        exp = figures["exporter"]
        print(
            f"{label:36}{exp:>9.3f}{figures['counts']:>9.3f}{figures['lists']:>9.3f}"
            f"{figures['counts'] / exp:>11.2f}x{figures['lists'] / exp:>10.2f}x"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
