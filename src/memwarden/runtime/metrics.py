"""A GovernedSession's state as Prometheus metrics over HTTP, while it serves.

``serve_metrics(session, port)`` starts ``prometheus_client``'s HTTP server on ``127.0.0.1:port``
(``port=0``: the OS picks one; ``.port`` says which) with one collector that reads the session at
each scrape. Every value of a scrape comes from one ``session.stats()`` call (plus the weight
streamer's placement, which stats does not carry), so a scrape is one consistent moment and a
value equals what ``stats()`` said at that moment. Nothing is sampled in the background: an idle
session costs nothing, and a scrape costs one ``stats()``.

The exporter holds the session and never changes it; it is a separate object (composition), so a
session runs the same with or without it.

Metrics (all prefixed ``memwarden_``):

=====================================  =======  ==============================================
budget_bytes                           gauge    the budget in force
held_bytes{category}                   gauge    weight (resident), kv_cache (the pool)
weights_resident_bytes                 gauge    weights held in memory
weights_streamed_bytes                 gauge    weights streamed from disk (0: none)
kv_pool_bytes                          gauge    the KV pool's size
kv_blocks / kv_blocks_used             gauge    pool capacity / blocks in use
kv_blocks_cached                       gauge    blocks kept for prefix reuse
kv_block_size_tokens                   gauge    tokens per block
prefix_hits / prefix_misses            counter  prefix-reuse lookups
kv_evictions                           counter  blocks evicted
encoder_cache_hits / _misses           counter  encoder-output cache lookups
requests                               counter  requests served
admission_decisions{action}            counter  admit, degrade, ... per admitted request
admission_refusals{reason}             counter  refusals the session recorded (``refuse`` events)
degradation_rung                       gauge    the rung of the latest request (0: none)
latency_level                          gauge    the latency rung that persists across requests
meta_predictions                       counter  meta-device predictions run
session_events{kind}                   counter  the session's log, by kind
telemetry_temp_celsius / _power_watts  gauge    the latest telemetry reading the budget followed
telemetry_fps                          gauge    (absent until the budget followed telemetry)
=====================================  =======  ==============================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["PREFIX", "SessionMetrics", "families", "serve_metrics", "streamed_weight_bytes"]

PREFIX = "memwarden_"
_TELEMETRY = (("temp_c", "telemetry_temp_celsius", "device temperature"),
              ("power_w", "telemetry_power_watts", "device power draw"),
              ("fps", "telemetry_fps", "frames per second the app runs at"))  # fmt: skip


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value)


def _labelled(kind: type[GaugeMetricFamily] | type[CounterMetricFamily], name: str, doc: str, label: str,
              values: dict[str, float]) -> Metric:  # fmt: skip
    family = kind(PREFIX + name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def streamed_weight_bytes(session: Any) -> int:
    """Bytes of weights the session streams from disk instead of holding (0 when it streams none)."""
    streamer = getattr(session, "streamer", None)
    placement = getattr(streamer, "placement", None)
    if placement is None:
        return 0
    return int(sum(item.nbytes for item in placement.weights if item.streamed))


def families(stats: dict[str, Any], streamed_bytes: int = 0) -> list[Metric]:
    """The metric families of one ``stats()`` snapshot: pure, so a test can compare the two."""
    requests = stats.get("requests", [])
    events = stats.get("events", [])
    decisions = Counter(str(r["decision"]["action"]) for r in requests)
    refusals = Counter(str(e.get("reason") or e.get("label", "")) for e in events if e.get("kind") == "refuse")
    out: list[Metric] = [
        _gauge("budget_bytes", "the memory budget in force, bytes", stats["budget_bytes"]),
        _labelled(
            GaugeMetricFamily,
            "held_bytes",
            "bytes the session holds between requests, by category",
            "category",
            {"weight": stats["weights_bytes"], "kv_cache": stats["kv_pool_bytes"]},
        ),  # fmt: skip
        _gauge("weights_resident_bytes", "weight bytes held in memory", stats["weights_bytes"]),
        _gauge("weights_streamed_bytes", "weight bytes streamed from disk per use", streamed_bytes),
        _gauge("kv_pool_bytes", "bytes of the paged KV pool", stats["kv_pool_bytes"]),
        _gauge("kv_blocks", "KV pool capacity, blocks", stats["kv_blocks"]),
        _gauge("kv_blocks_used", "KV blocks in use", stats["kv_blocks"] - stats["kv_free_blocks"]),
        _gauge("kv_blocks_cached", "KV blocks kept for prefix reuse", stats["kv_cached_blocks"]),
        _gauge("kv_block_size_tokens", "tokens per KV block", stats["block_size"]),
        _counter("prefix_hits", "prefix-reuse lookups that found cached blocks", stats["prefix_hits"]),
        _counter("prefix_misses", "prefix-reuse lookups that found none", stats["prefix_misses"]),
        _counter("kv_evictions", "KV blocks evicted", stats["evictions"]),
        _counter("encoder_cache_hits", "media encodings served from the encoder cache", stats["encoder_hits"]),
        _counter("encoder_cache_misses", "media encodings computed", stats["encoder_misses"]),
        _counter("requests", "requests served", len(requests)),
        _labelled(
            CounterMetricFamily,
            "admission_decisions",
            "admitted requests by admission's action",
            "action",
            dict(decisions),
        ),  # fmt: skip
        _labelled(CounterMetricFamily, "admission_refusals", "requests refused, by reason", "reason", dict(refusals)),
        _gauge(
            "degradation_rung",
            "degradation rung of the latest request (0: none)",
            requests[-1]["rung"] if requests else 0,
        ),  # fmt: skip
        _gauge("latency_level", "latency rung that persists across requests", stats["latency_level"]),
        _counter("meta_predictions", "meta-device peak predictions run", stats["meta_predictions"]),
        _labelled(
            CounterMetricFamily,
            "session_events",
            "the session's log entries, by kind",
            "kind",
            dict(Counter(str(e.get("kind")) for e in events)),
        ),  # fmt: skip
    ]
    reading = next((e for e in reversed(events) if e.get("kind") == "budget" and "temp_c" in e), None)
    for key, name, doc in _TELEMETRY:
        if reading is not None and reading.get(key) is not None:
            out.append(_gauge(name, f"latest telemetry reading the budget followed: {doc}", float(reading[key])))
    return out


class SessionMetrics(Collector):
    """A Prometheus collector over one GovernedSession, and the HTTP server that exposes it."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._server: Any = None
        self._thread: Any = None
        self.port: int | None = None
        self.host = "127.0.0.1"

    def collect(self) -> Iterator[Metric]:
        yield from families(self.session.stats(), streamed_weight_bytes(self.session))

    def start(self, port: int, addr: str = "127.0.0.1") -> SessionMetrics:
        """Serve ``/metrics`` on ``addr:port`` from a daemon thread (``port=0``: any free port)."""
        if self._server is not None:
            raise RuntimeError(f"already serving on {self.url}")
        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        self.host, self.port = addr, int(self._server.server_port)
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> SessionMetrics:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_metrics(session: Any, port: int, addr: str = "127.0.0.1") -> SessionMetrics:
    """Expose ``session``'s metrics on ``http://addr:port/metrics``; ``.stop()`` ends it."""
    return SessionMetrics(session).start(port, addr)
