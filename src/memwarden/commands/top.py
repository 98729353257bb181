"""memwarden top URL [--interval S] [--once]: a running session's metrics, refreshed in place."""

from __future__ import annotations

import argparse
import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from memwarden.errors import InputError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "top",
        help="watch a GovernedSession's metrics endpoint live (serve_metrics)",
        description="Read a running GovernedSession's Prometheus metrics (memwarden.runtime.metrics.serve_metrics) "
        "and show its budget, held bytes, KV pool, caches, admission decisions, rung and telemetry, refreshed in "
        "place, in 80 columns.",
        epilog="example:\n  memwarden top 127.0.0.1:9464\n  memwarden top http://127.0.0.1:9464/metrics --once",
    )
    p.add_argument("url", help="the session's metrics: http://HOST:PORT/metrics, or HOST:PORT")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between refreshes (1)")
    p.add_argument("--once", action="store_true", help="print one screen and exit")
    p.set_defaults(func=run)


def normalize_url(text: str) -> str:
    url = text if "://" in text else f"http://{text}"
    scheme, _, rest = url.partition("://")
    try:
        port = urllib.parse.urlsplit(url).port  # ValueError: a port that is not a number in 0..65535
    except ValueError:
        port = -1
    # http.client refuses control characters and spaces with InvalidURL, which is no ValueError
    printable = all(33 <= ord(c) < 127 or ord(c) > 159 for c in url)
    if scheme not in ("http", "https") or not rest or port == -1 or not printable:
        raise InputError(f"{text!r}: expected http://HOST:PORT/metrics or HOST:PORT")
    return url if "/" in rest else url + "/metrics"


def fetch(url: str, timeout_s: float = 5.0) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The endpoint's samples, parsed by prometheus_client; InputError when it cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text = response.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise InputError(f"{url}: cannot read metrics ({reason})") from None
    try:
        return {
            (s.name, tuple(sorted(s.labels.items()))): float(s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
    except ValueError as exc:
        raise InputError(f"{url}: not Prometheus metrics ({exc})") from None


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from memwarden.report.top import render_top

    if not args.interval > 0:
        raise InputError("--interval must be more than 0 seconds")
    url = normalize_url(args.url)
    console = Console(width=min(80, Console().width))
    samples = fetch(url)
    if args.once:
        console.print(render_top(samples, url))
        return 0
    previous = None
    with Live(render_top(samples, url), console=console, refresh_per_second=4, screen=False) as live:
        while True:
            time.sleep(args.interval)
            previous, samples = samples, fetch(url)
            live.update(render_top(samples, url, previous, args.interval))
