"""What exposing a GovernedSession's metrics costs: one scrape, and scrapes per request served.

    .venv/bin/python benchmarks/bench_metrics.py [REQUESTS]

Serves REQUESTS requests of the tiny llava zoo model under a 1 GiB budget while a scraper thread
fetches /metrics over 127.0.0.1 every 100 ms (Prometheus' usual interval is 15 s: this is 150x
denser). Reports the server-side render (one ``stats()`` + exposition) and the HTTP round trip per
scrape, at the start and after every request was served (``stats()`` lists every request, so its
cost grows with them), and the render time spent per request served.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
import urllib.request

import torch
from prometheus_client import generate_latest

from memwarden.models import zoo
from memwarden.runtime.metrics import SessionMetrics, serve_metrics
from memwarden.runtime.session import GovernedSession


def _render_ms(metrics: SessionMetrics, repeat: int = 50) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        generate_latest(metrics.registry)
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def _round_trip_ms(url: str, repeat: int = 20) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as r:
            r.read()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main(requests: int = 100) -> None:
    model = zoo.build_model("llava")
    inputs = zoo.make_inputs(model, prompt_tokens=24)
    with GovernedSession(model, budget="1GiB", encoder_cache=True) as session:
        metrics = serve_metrics(session, 0)
        first_render, first_trip = _render_ms(metrics), _round_trip_ms(metrics.url)
        stop = threading.Event()
        scrape_s: list[float] = []

        def scraper() -> None:
            while not stop.wait(0.1):
                t = time.perf_counter()
                generate_latest(metrics.registry)  # what the server does per scrape
                scrape_s.append(time.perf_counter() - t)
                with urllib.request.urlopen(metrics.url, timeout=30) as r:
                    r.read()

        thread = threading.Thread(target=scraper)
        thread.start()
        start = time.perf_counter()
        with torch.inference_mode():
            for _ in range(requests):
                session.generate(**inputs, max_new_tokens=3, **zoo.generate_kwargs("llava"))
        wall = time.perf_counter() - start
        stop.set()
        thread.join()
        last_render, last_trip = _render_ms(metrics), _round_trip_ms(metrics.url)
        metrics.stop()
    print(
        f"requests {requests} in {wall:.2f} s; scrapes {len(scrape_s)} (every 100 ms)\n"
        f"one scrape: render {first_render:.3f} ms, HTTP round trip {first_trip:.3f} ms at 0 requests; "
        f"render {last_render:.3f} ms, round trip {last_trip:.3f} ms at {requests}\n"
        f"render time per request served: {1000 * sum(scrape_s) / requests:.3f} ms"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
