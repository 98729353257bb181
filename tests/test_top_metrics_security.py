"""The metrics endpoint against half-open connections, and ``memwarden top`` against hostile
endpoints (endless, dribbling, missing labels, markup in labels), over real sockets on 127.0.0.1
and real subprocesses. Nothing waits on a clock: a timeout only guards against a hang."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from memwarden.runtime.metrics import BoundedServer

GUARD_S = 120
BODY = b"memwarden_budget_bytes 1024\n"


def app(environ: dict[str, object], start_response: Callable[..., object]) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))])
    return [BODY]


def top(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memwarden.cli", "top", *args], capture_output=True, text=True, timeout=GUARD_S
    )


def test_half_open_connections_take_no_thread_and_scrapes_are_answered() -> None:
    server = BoundedServer("127.0.0.1", 0, app, workers=4, max_pending=256)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    before = threading.active_count()
    held = []
    try:
        for _ in range(600):  # connect, send nothing: what kept one thread each for ever
            held.append(socket.create_connection(("127.0.0.1", server.port), timeout=GUARD_S))
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=GUARD_S) as response:
            assert response.read() == BODY
        assert threading.active_count() <= before + 4  # the pool, never a thread per connection
        # Past max_pending the oldest silent connections were closed: the first one reads EOF.
        held[0].settimeout(GUARD_S)
        assert held[0].recv(1) == b""
    finally:
        for s in held:
            s.close()
        server.shutdown()
        thread.join(GUARD_S)
        server.close()


def test_a_stalled_request_is_served_by_the_pool_without_blocking_others() -> None:
    server = BoundedServer("127.0.0.1", 0, app, workers=2)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stalled = []
    try:
        for _ in range(2):  # started requests that never finish: they hold the two workers
            s = socket.create_connection(("127.0.0.1", server.port), timeout=GUARD_S)
            s.sendall(b"GET /metrics HTTP/1.0\r\n")
            stalled.append(s)
        late = socket.create_connection(("127.0.0.1", server.port), timeout=GUARD_S)
        late.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")  # queued until the idle timeout frees a worker
        late.settimeout(GUARD_S)
        assert late.recv(1 << 16).startswith(b"HTTP/1.0 200")
        late.close()
    finally:
        for s in stalled:
            s.close()
        server.shutdown()
        thread.join(GUARD_S)
        server.close()


def serve_raw(handler: Callable[[socket.socket], None]) -> Iterator[int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_quietly, args=(handler, conn), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


def _quietly(handler: Callable[[socket.socket], None], conn: socket.socket) -> None:
    try:
        conn.recv(4096)
        handler(conn)
    except OSError:
        pass
    finally:
        conn.close()


def endless(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
    line = b"# " + b"x" * 65000 + b"\n"
    while True:
        conn.sendall(line)


def dribbling(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\n")
    stop = threading.Event()
    while not stop.wait(0.5):  # a byte every half second: each read succeeds, the answer never ends
        conn.sendall(b"#")


def hostile_labels(conn: socket.socket) -> None:
    body = (
        b"memwarden_budget_bytes 1e9\n"
        b"memwarden_held_bytes 100\n"  # the category label missing
        b'memwarden_held_bytes{category="[/bogus][link=file:///etc/passwd]x"} 200\n'
        b'memwarden_admission_decisions_total{action="\\u001b[2J[red]"} 3\n'
        b'memwarden_admission_refusals_total{reason="[/x] \x1b]0;title\x07"} 2\n'
        b'memwarden_admission_refusals_total{other="y"} 1\n'
    )
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


@pytest.fixture
def raw_server(request: pytest.FixtureRequest) -> Iterator[int]:
    yield from serve_raw(request.param)


@pytest.mark.parametrize("raw_server", [endless], indirect=True)
def test_top_cuts_an_endless_answer_at_its_budget(raw_server: int) -> None:
    result = top(f"127.0.0.1:{raw_server}", "--once")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "cannot read metrics (more than" in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("raw_server", [dribbling], indirect=True)
def test_top_gives_up_on_a_dribbling_answer_at_its_deadline(raw_server: int) -> None:
    result = top(f"127.0.0.1:{raw_server}", "--once")
    assert result.returncode == 2 and "no complete answer within" in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("raw_server", [hostile_labels], indirect=True)
def test_top_missing_labels_and_markup_are_shown_not_applied(raw_server: int) -> None:
    result = top(f"127.0.0.1:{raw_server}", "--once")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "[/bogus][link=" in result.stdout  # the cell is cut at its width; the text is there, not a link
    assert "\x1b" not in result.stdout and "[/x]" in result.stdout


def test_top_interval_inf_is_one_line() -> None:
    for value in ("inf", "1e400", "nan"):
        result = top("127.0.0.1:1", "--interval", value)
        assert result.returncode == 2 and "--interval" in result.stderr and "Traceback" not in result.stderr
