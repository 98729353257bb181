"""A GovernedSession's state as Prometheus metrics over HTTP, while it serves.

``serve_metrics(session, port)`` starts ``prometheus_client``'s HTTP server on ``127.0.0.1:port``
(``port=0``: the OS picks one; ``.port`` says which) with one collector that reads the session at
each scrape. Every value of a scrape comes from one ``session.stats(include_requests=False)`` call
(plus the weight streamer's placement, which stats does not carry), so a scrape is one consistent
moment and a value equals what ``stats()`` said at that moment. Nothing is sampled in the
background: an idle session costs nothing, and a scrape costs one ``stats()`` without the lists of
events and requests: the counts it reports (requests, decisions, refusals, log entries) are kept as
the session runs (``runtime/session_tally.py``), so a scrape costs the same after a million
requests as after one. A scrape that finds the session as the last one left it (an idle service,
a request still decoding, two Prometheus servers scraping one target) is answered with the last
exposition's bytes instead of formatting them again: formatting is most of a scrape's cost, and
the bytes are those of a snapshot equal to the session's stats at that moment.

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
admission_refusals{reason}             counter  refused requests by reason (``Refusal``: over_budget, ...)
degradation_rung                       gauge    the rung of the latest request (0: none)
latency_level                          gauge    the latency rung that persists across requests
meta_predictions                       counter  meta-device predictions run
session_events{kind}                   counter  the session's log, by kind
telemetry_temp_celsius / _power_watts  gauge    the latest telemetry reading the budget followed
telemetry_fps                          gauge    (absent until the budget followed telemetry)
=====================================  =======  ==============================================
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import make_wsgi_app
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["PREFIX", "BoundedServer", "SessionMetrics", "families", "serve_metrics", "streamed_weight_bytes"]

PREFIX = "memwarden_"
_TELEMETRY = (
    ("temp_c", "telemetry_temp_celsius", "device temperature"),
    ("power_w", "telemetry_power_watts", "device power draw"),
    ("fps", "telemetry_fps", "frames per second the app runs at"),
)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value)


def _labelled(
    kind: type[GaugeMetricFamily] | type[CounterMetricFamily], name: str, doc: str, label: str, values: dict[str, float]
) -> Metric:
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
    """The metric families of one ``stats()`` snapshot (with or without its lists: only the counts are
    read, so the cost does not grow with the requests served); pure, so a test can compare the two."""
    out: list[Metric] = [
        _gauge("budget_bytes", "the memory budget in force, bytes", stats["budget_bytes"]),
        _labelled(
            GaugeMetricFamily,
            "held_bytes",
            "bytes the session holds between requests, by category",
            "category",
            {"weight": stats["weights_bytes"], "kv_cache": stats["kv_pool_bytes"]},
        ),
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
        _counter("requests", "requests served", stats["requests_served"]),
        _labelled(
            CounterMetricFamily,
            "admission_decisions",
            "admitted requests by admission's action",
            "action",
            stats["decisions"],
        ),
        _labelled(
            CounterMetricFamily, "admission_refusals", "requests refused, by reason", "reason", stats["refusals"]
        ),
        _gauge("degradation_rung", "degradation rung of the latest request (0: none)", stats["degradation_rung"]),
        _gauge("latency_level", "latency rung that persists across requests", stats["latency_level"]),
        _counter("meta_predictions", "meta-device peak predictions run", stats["meta_predictions"]),
        _labelled(
            CounterMetricFamily,
            "session_events",
            "the session's log entries, by kind",
            "kind",
            stats["event_counts"],
        ),
    ]
    reading = stats["telemetry"]
    for key, name, doc in _TELEMETRY:
        if key in reading:
            out.append(_gauge(name, f"latest telemetry reading the budget followed: {doc}", reading[key]))
    return out


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """A scrape every few seconds is not news: log nothing."""


class BoundedServer:
    """The HTTP server of the metrics: at most ``workers`` threads, whatever the clients do.

    One thread accepts and watches connections with a selector; a connection goes to the worker
    pool only once its request has started to arrive, so a client that connects and sends nothing
    costs a descriptor, not a thread, and is closed after ``idle_timeout_s``; past
    ``max_pending`` such connections the oldest is closed. A worker reads with the same idle
    timeout on every socket call and serves one request per connection (HTTP/1.0, as
    ``prometheus_client``'s server does); at most ``max_queued`` connections wait for a worker,
    later ones are closed. So scrapes keep being answered while hundreds of half-open connections
    are held open (``tests/test_top_metrics_security.py``)."""

    def __init__(
        self,
        addr: str,
        port: int,
        app: Callable[..., Iterable[bytes]],
        *,
        workers: int = 4,
        max_pending: int = 256,
        max_queued: int = 64,
        idle_timeout_s: float = 10.0,
    ) -> None:
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        server_class = type("_Server", (WSGIServer,), {"address_family": family})
        self._wsgi: WSGIServer = make_server(addr, port, app, server_class, handler_class=_QuietHandler)
        self.port = int(self._wsgi.server_port)
        self.max_pending, self.max_queued, self.idle_timeout_s = max_pending, max_queued, idle_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="memwarden-metrics")
        self._lock = threading.Lock()
        self._busy: set[socket.socket] = set()  # queued or being served
        self._pending: dict[socket.socket, tuple[Any, float]] = {}  # accepted, nothing read yet: (address, since)
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False

    def serve_forever(self) -> None:
        listener = self._wsgi.socket
        listener.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, "listen")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stopping:
                for key, _ in sel.select(timeout=self._next_expiry()):
                    if key.data == "listen":
                        self._accept(sel, listener)
                    elif key.data == "conn":
                        conn = key.fileobj
                        assert isinstance(conn, socket.socket)
                        if (entry := self._pending.pop(conn, None)) is not None:  # not dropped this round
                            sel.unregister(conn)
                            self._dispatch(conn, entry[0])
                now = time.monotonic()
                for conn, (_address, since) in list(self._pending.items()):
                    if now - since > self.idle_timeout_s:
                        self._drop(sel, conn)
        finally:
            for conn in list(self._pending):
                self._drop(sel, conn)
            sel.close()

    def _next_expiry(self) -> float | None:
        if not self._pending:
            return None
        oldest = min(since for _address, since in self._pending.values())
        return max(0.0, oldest + self.idle_timeout_s - time.monotonic()) + 0.01

    def _accept(self, sel: selectors.BaseSelector, listener: socket.socket) -> None:
        while True:
            try:
                conn, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, a reset before accept: the next one may do
                return
            conn.setblocking(False)
            self._pending[conn] = (address, time.monotonic())
            sel.register(conn, selectors.EVENT_READ, "conn")
            if len(self._pending) > self.max_pending:  # the oldest silent connection makes room
                self._drop(sel, next(iter(self._pending)))

    def _drop(self, sel: selectors.BaseSelector, conn: socket.socket) -> None:
        self._pending.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn)
        conn.close()

    def _dispatch(self, conn: socket.socket, address: Any) -> None:
        with self._lock:
            if len(self._busy) >= self.max_queued or self._stopping:
                conn.close()
                return
            self._busy.add(conn)
        self._pool.submit(self._handle, conn, address)

    def _handle(self, conn: socket.socket, address: Any) -> None:
        try:
            conn.settimeout(self.idle_timeout_s)  # every read and write, not just the first
            self._wsgi.finish_request(conn, address)
        except Exception:  # a client that went away, stalled or sent garbage: nothing to report
            pass
        finally:
            with self._lock:
                self._busy.discard(conn)
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def shutdown(self) -> None:
        """Stop serving: ``serve_forever`` returns; connections being served are cut."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        with self._lock:
            for conn in self._busy:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._wsgi.server_close()
        self._wake_r.close()
        self._wake_w.close()


Snapshot = tuple[dict[str, Any], int]  # stats(include_requests=False), streamed weight bytes


class SessionMetrics(Collector):
    """A Prometheus collector over one GovernedSession, and the HTTP server that exposes it.

    ``app`` is the WSGI application the server runs (prometheus_client's, answering from the last
    exposition while the session is unchanged); it can be mounted in an application's own server."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._server: Any = None
        self._thread: Any = None
        self.port: int | None = None
        self.host = "127.0.0.1"
        self._lock = threading.RLock()  # one exposition at a time; collect() under it renders its snapshot
        self._rendering: Snapshot | None = None
        self._last: tuple[tuple[Any, ...], tuple[str, list[tuple[str, str]], bytes]] | None = None
        self._prometheus_app = make_wsgi_app(self.registry)

    def snapshot(self) -> Snapshot:
        return self.session.stats(include_requests=False), streamed_weight_bytes(self.session)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            stats, streamed = self._rendering or self.snapshot()
        yield from families(stats, streamed)

    def app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """The WSGI application: prometheus_client's, run again only when the session or the request
        (method, path, query, accepted formats and encodings) differs from the last one's."""
        request = tuple(
            environ.get(k)
            for k in ("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "HTTP_ACCEPT", "HTTP_ACCEPT_ENCODING")
        )
        with self._lock:
            snapshot = self.snapshot()
            key = (snapshot, request)
            if self._last is None or self._last[0] != key:
                baked: dict[str, Any] = {}

                def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
                    baked.update(status=status, headers=headers)
                    return lambda _: None

                self._rendering = snapshot
                try:
                    body = b"".join(self._prometheus_app(environ, keep))
                finally:
                    self._rendering = None
                self._last = (key, (baked["status"], baked["headers"], body))
            status, headers, body = self._last[1]
        start_response(status, list(headers))
        return [body]

    def start(self, port: int, addr: str = "127.0.0.1") -> SessionMetrics:
        """Serve ``/metrics`` on ``addr:port`` (``port=0``: any free port) with :meth:`app` as the
        application, from a bounded server (:class:`BoundedServer`): a fixed pool of worker threads,
        idle connections closed, so half-open connections cannot take the scrapes' threads."""
        if self._server is not None:
            raise RuntimeError(f"already serving on {self.url}")
        self._server = BoundedServer(addr, port, self.app)
        self._thread = threading.Thread(target=self._server.serve_forever, name="memwarden-metrics", daemon=True)
        self._thread.start()
        self.host, self.port = addr, self._server.port
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._thread.join()
        self._server.close()
        self._server = self._thread = None

    def __enter__(self) -> SessionMetrics:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_metrics(session: Any, port: int, addr: str = "127.0.0.1") -> SessionMetrics:
    """Expose ``session``'s metrics on ``http://addr:port/metrics``; ``.stop()`` ends it."""
    return SessionMetrics(session).start(port, addr)
