"""memwarden top URL [--interval S] [--once]: a running session's metrics, refreshed in place."""

from __future__ import annotations

import argparse
import socket
import ssl
import time
import urllib.parse
from typing import Any

from memwarden.errors import InputError
from memwarden.untrusted import markup_safe, terminal_safe


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


MAX_METRICS_BYTES = 8 << 20  # a session's exposition is a few KiB; an endless stream is cut here
FETCH_DEADLINE_S = 5.0  # for the whole answer, connect to last byte: a dribbling server is cut here
# The labels the screen reads, per family; a sample without its label, or with others, is not ours.
_LABELS = {
    "memwarden_held_bytes": "category",
    "memwarden_admission_decisions_total": "action",
    "memwarden_admission_refusals_total": "reason",
}
_PLAIN_TEXT_LABELS = ("memwarden_admission_refusals_total",)  # shown as rich Text, not as markup


def _http_get(url: str, timeout_s: float) -> bytes:
    """The body of ``GET url`` within ``timeout_s`` in all and ``MAX_METRICS_BYTES``: every socket
    call gets only the time left, so a server that sends a byte a second cannot hold the reader."""
    parts = urllib.parse.urlsplit(url)
    host, secure = parts.hostname or "", parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no complete answer within {timeout_s:g} s")
        return remaining

    sock = socket.create_connection((host, port), timeout=left())
    try:
        if secure:
            sock.settimeout(left())
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        request = (
            f"GET {target} HTTP/1.0\r\nHost: {parts.netloc.rpartition('@')[2]}\r\n"
            "Accept: text/plain\r\nUser-Agent: memwarden-top\r\nConnection: close\r\n\r\n"
        )
        sock.settimeout(left())
        sock.sendall(request.encode("utf-8"))
        data = bytearray()
        while True:
            sock.settimeout(left())
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_METRICS_BYTES + (1 << 16):
                raise _Refused(f"more than {MAX_METRICS_BYTES} bytes")
    finally:
        sock.close()
    return _body(bytes(data))


class _Refused(Exception):
    """An answer that is not one a metrics endpoint gives."""


def _body(data: bytes) -> bytes:
    head, sep, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if not sep or len(status) < 2 or not status[0].startswith(b"HTTP/"):
        raise _Refused("not an HTTP response")
    if status[1] != b"200":
        raise _Refused(f"HTTP {terminal_safe(status[1].decode('ascii', 'replace'))[:20]}")
    headers = {
        k.strip().lower(): v.strip().lower() for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])
    }
    if headers.get(b"content-encoding", b"identity") != b"identity":
        raise _Refused("an encoded answer (asked for identity)")
    if headers.get(b"transfer-encoding") == b"chunked":
        body = _dechunk(body)
    length = headers.get(b"content-length")
    if length is not None and length.isdigit() and len(length) < 12:
        if len(body) < int(length):
            raise _Refused("the answer ended early")
        body = body[: int(length)]
    return body


def _dechunk(body: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        line_end = body.find(b"\r\n", pos)
        size_text = body[pos:line_end].split(b";")[0].strip() if line_end >= 0 else b""
        try:
            size = int(size_text[:16], 16)
        except ValueError:
            raise _Refused("a bad chunked answer") from None
        if size == 0:
            return bytes(out)
        out += body[line_end + 2 : line_end + 2 + size]
        pos = line_end + 2 + size + 2


def fetch(url: str, timeout_s: float = FETCH_DEADLINE_S) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The endpoint's samples, parsed by prometheus_client, within ``timeout_s`` and
    ``MAX_METRICS_BYTES``; InputError when it cannot be read. Only memwarden's families are kept,
    each with the labels the screen reads, their values escaped for the terminal and rich markup."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = _http_get(url, timeout_s).decode("utf-8", "replace")
    except TimeoutError:  # socket.timeout too: the time left ran out inside a socket call
        raise InputError(f"{url}: cannot read metrics (no complete answer within {timeout_s:g} s)") from None
    except (OSError, ssl.SSLError, UnicodeError, ValueError, _Refused) as exc:
        reason = terminal_safe(getattr(exc, "strerror", None) or exc)
        raise InputError(f"{url}: cannot read metrics ({reason[:200]})") from None
    try:
        found = [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:  # the parser's own errors
        raise InputError(f"{url}: not Prometheus metrics ({terminal_safe(exc)[:200]})") from None
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for name, labels, value in found:
        if not name.startswith("memwarden_") or set(labels) != ({_LABELS[name]} if name in _LABELS else set()):
            continue
        safe = terminal_safe if name in _PLAIN_TEXT_LABELS else markup_safe
        try:
            out[(name, tuple(sorted((k, safe(v[:80])) for k, v in labels.items())))] = float(value)
        except (TypeError, ValueError, OverflowError):
            continue
    return out


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from memwarden.report.top import render_top

    if not 0 < args.interval <= 3600:  # inf and NaN fail too: time.sleep(inf) overflows
        raise InputError("--interval must be more than 0 and at most 3600 seconds")
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
