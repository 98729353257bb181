"""``memwarden collect``: receives the traces ``memwarden trace --sink`` sends (``sink.py``) and
keeps one file per run, outside the container that ran it.

It reads from the network, so every client is taken as hostile:

- nothing a client sends is run or parsed beyond one JSON header line of at most
  ``wire.HEADER_LIMIT`` bytes; the body is stored as bytes, checked only for the trace's magic;
- a client names no path: the file is ``DIR/NAME-RUN.mwtrace`` from a name and a run id that must
  match ``wire.NAME_RE``/``wire.RUN_RE`` (no separator, no leading dot), written through a
  temporary file opened ``O_EXCL | O_NOFOLLOW`` in DIR and renamed, so no link leads out of DIR;
- each part is cut at ``max_part_bytes``, and at most ``max_connections`` are served at once
  (each with a ``HEADER_TIMEOUT_S`` deadline for its header); the collector holds at most one
  receive buffer (``RECV_BYTES``) per connection, whatever the trace's size;
- every refusal is one line, to the client (``error: ...``) and to the collector's log.

The listener is loopback (or a Unix socket) unless ``allow_remote``: the protocol has no
authentication, so opening it to a network is the operator's explicit choice.

A stream part replaces the run's file once its first ``initial`` bytes have arrived and keeps
writing into it; an older part never replaces a newer one; a ``final`` part (the complete trace)
replaces it once whole. A connection that ends early leaves the file as far as it got, which
``memwarden.load`` reads up to the last whole chunk.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memwarden.record.live.wire import HEADER_LIMIT, NAME_RE, RUN_RE, SINK_MAGIC, SinkAddress, SinkError
from memwarden.trace.format import FORMAT_MAGIC
from memwarden.trace.stream import STREAM_MAGIC

__all__ = ["Collector", "RunStore"]

DEFAULT_MAX_PART_BYTES = 4 << 30
DEFAULT_MAX_CONNECTIONS = 64
HEADER_TIMEOUT_S = 10.0
RECV_BYTES = 1 << 16
DRAIN_BYTES, DRAIN_S = 1 << 20, 2.0  # what a refused client may still send before the close
_MAX_PARTS = 1_000_000
_REMEMBERED_RUNS = 4096  # the newest part of this many runs is remembered (older parts refused)


def _int(header: dict[str, Any], key: str, low: int, high: int) -> int:
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"header field {key!r} must be an integer in {low}..{high}")
    return value


class RunStore:
    """The directory of runs: ``open`` a part from its header, write its bytes, ``close`` it."""

    def __init__(self, directory: Path, max_part_bytes: int = DEFAULT_MAX_PART_BYTES) -> None:
        self.directory = directory
        self.max_part_bytes = max_part_bytes
        self._lock = threading.Lock()
        self._newest: OrderedDict[str, int] = OrderedDict()  # run -> newest part installed

    def check(self) -> None:
        if not self.directory.is_dir():
            raise SinkError(f"{self.directory}: not a directory")
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise SinkError(f"{self.directory}: not writable")

    def open(self, header: Any) -> Part:
        """A part to write, or ValueError (one line) for a header that is refused."""
        if not isinstance(header, dict):
            raise ValueError("the header must be a JSON object")
        kind, run, name = header.get("kind"), header.get("run"), header.get("name")
        if kind not in ("stream", "final", "hello"):
            raise ValueError("header field 'kind' must be stream, final or hello")
        if not isinstance(run, str) or not RUN_RE.fullmatch(run):
            raise ValueError("header field 'run' must be 16-64 lowercase hex digits")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ValueError("header field 'name' must be 1-64 of A-Z a-z 0-9 . _ - (not starting with . or -)")
        if kind == "hello":
            return Part(self, None, kind, run, "", 0, 0)
        part = _int(header, "part", 1, _MAX_PARTS)
        expected = _int(header, "initial" if kind == "stream" else "size", len(STREAM_MAGIC), self.max_part_bytes)
        with self._lock:
            newest = self._newest.get(run, 0)
        if part <= newest:
            raise ValueError(f"part {part} is not newer than the run's part {newest}")
        file = f"{name}-{run}.mwtrace"
        tmp = self.directory / f".{file}.{part}.partial"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        return Part(self, fd, kind, run, file, part, expected)

    def _install(self, part: Part) -> bool:
        """Rename ``part``'s file over the run's, unless a newer part got there first."""
        with self._lock:
            if self._newest.get(part.run, 0) >= part.number:
                return False
            os.replace(part.tmp, self.directory / part.file)
            self._newest[part.run] = part.number
            self._newest.move_to_end(part.run)
            while len(self._newest) > _REMEMBERED_RUNS:
                self._newest.popitem(last=False)
        return True


class Part:
    """One connection's bytes on their way to a run's file."""

    def __init__(
        self, store: RunStore, fd: int | None, kind: str, run: str, file: str, number: int, expected: int
    ) -> None:
        self.store, self.fd, self.kind, self.run, self.file = store, fd, kind, run, file
        self.number, self.expected = number, expected
        self.tmp = store.directory / f".{file}.{number}.partial"
        self.written = 0
        self.installed = False
        self._head = b""
        self._magic = STREAM_MAGIC if kind == "stream" else FORMAT_MAGIC

    def write(self, data: bytes) -> None:
        if self.fd is None:
            raise ValueError("a hello carries no data")
        if len(self._head) < len(self._magic):
            self._head += data[: len(self._magic) - len(self._head)]
            if not self._magic.startswith(self._head):
                self.abort()
                raise ValueError(f"not a memwarden {'stream' if self.kind == 'stream' else 'trace'}")
        room = self.store.max_part_bytes - self.written
        if self.kind == "final" and self.written + len(data) > self.expected:
            self.abort()
            raise ValueError(f"more than the {self.expected} bytes announced")
        if len(data) > room:
            if room > 0:
                self._write_all(data[:room])
            self.finish_stream()
            raise ValueError(f"part over the collector's limit of {self.store.max_part_bytes} bytes; kept so far")
        self._write_all(data)
        if self.kind == "stream" and not self.installed and self.written >= self.expected:
            self.installed = self.store._install(self)

    def _write_all(self, data: bytes) -> None:
        assert self.fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        self.written += len(data)

    def finish_stream(self) -> None:
        """A stream part that ends keeps what it installed; one that never got that far goes."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            if not self.installed:
                self.tmp.unlink(missing_ok=True)

    def abort(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            if not self.installed:
                self.tmp.unlink(missing_ok=True)

    def close(self) -> str:
        """The part's last word: what the run's file now holds."""
        if self.kind == "hello":
            return "ok"
        if self.kind == "stream":
            installed = self.installed
            self.finish_stream()
            if installed:
                return f"ok {self.file}: stream part {self.number} ended at {self.written} bytes"
            return f"error: {self.file}: part {self.number} ended before its first {self.expected} bytes"
        if self.fd is not None and self.written == self.expected and len(self._head) == len(self._magic):
            os.close(self.fd)
            self.fd = None
            if self.store._install(self):
                return f"ok {self.file}: complete trace, {self.written} bytes"
            self.tmp.unlink(missing_ok=True)
            return f"error: {self.file}: a newer part arrived first"
        got = self.written
        self.abort()
        return f"error: {self.file}: trace cut at {got} of {self.expected} bytes; the run's file is unchanged"


def _read_header(sock: socket.socket) -> Any:
    line = bytearray()
    while True:
        b = sock.recv(1)
        if not b:
            raise ValueError("connection closed before the header's end")
        if b == b"\n":
            break
        line += b
        if len(line) >= HEADER_LIMIT:
            raise ValueError(f"header longer than {HEADER_LIMIT} bytes")
    if not line.startswith(SINK_MAGIC):
        raise ValueError("not a memwarden sink (the header must begin 'MWSINK1 ')")
    try:
        return json.loads(bytes(line[len(SINK_MAGIC) :]))
    except (ValueError, RecursionError):
        raise ValueError("the header is not JSON") from None


class Collector:
    """Serves ``address`` (``bind`` then ``serve_forever``) into ``directory``; ``log`` gets one
    line per event (a part begun, a trace stored, a client refused)."""

    def __init__(
        self,
        address: SinkAddress,
        directory: Path,
        *,
        max_part_bytes: int = DEFAULT_MAX_PART_BYTES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.address = address
        self.store = RunStore(directory, max_part_bytes)
        self.log = log
        self._slots = threading.BoundedSemaphore(max_connections)
        self._server: socketserver.BaseServer | None = None

    def bind(self) -> SinkAddress:
        """Listen; returns the address as bound (port 0 becomes the port given)."""
        collector = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                collector._handle(self.request, self.client_address)

        if self.address.kind == "unix":
            unix = socketserver.ThreadingUnixStreamServer(self.address.path, Handler)
            unix.daemon_threads = True
            self._server = unix
            return self.address
        family = socket.AF_INET6 if ":" in self.address.host else socket.AF_INET

        class Server(socketserver.ThreadingTCPServer):
            address_family = family
            allow_reuse_address = True
            daemon_threads = True

        tcp = Server((self.address.host, self.address.port), Handler)
        self._server = tcp
        return SinkAddress("tcp", host=self.address.host, port=int(tcp.server_address[1]))

    def serve_forever(self) -> None:
        assert self._server is not None
        self._server.serve_forever(poll_interval=0.2)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self.address.kind == "unix":
                Path(self.address.path).unlink(missing_ok=True)

    def _handle(self, sock: socket.socket, peer: Any) -> None:
        who = "a unix client" if self.address.kind == "unix" else f"{peer[0]}:{peer[1]}"
        if not self._slots.acquire(blocking=False):
            self._refuse(sock, who, "too many connections")
            return
        part: Part | None = None
        try:
            sock.settimeout(HEADER_TIMEOUT_S)
            try:
                part = self.store.open(_read_header(sock))
            except (ValueError, OSError) as exc:
                self._refuse(sock, who, str(exc) if isinstance(exc, ValueError) else "cannot store the run here")
                return
            sock.sendall(b"ok\n")
            if part.kind == "stream" and part.number == 1:  # later parts: the flight recorder's rewrites
                self.log(f"memwarden: {part.file}: receiving the stream from {who}")
            # A traced script may be quiet for hours between flushes: no deadline once the header
            # is in (the connection cap bounds what idle clients hold); keepalive finds dead peers.
            sock.settimeout(None)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            try:
                while data := sock.recv(RECV_BYTES):
                    part.write(data)
            except ValueError as exc:
                self._refuse(sock, who, f"{part.file}: {exc}")
                return
            except OSError:  # the peer vanished (a killed container): keep what arrived
                pass
            answer = part.close()
            if part.kind == "final" or answer.startswith("error"):  # a stream part's end is no news
                self.log(f"memwarden: {answer}" if answer.startswith("error") else f"memwarden: stored {answer[3:]}")
            try:
                sock.sendall(answer.encode() + b"\n")
            except OSError:
                pass
        finally:
            if part is not None:  # a connection that broke off: a final goes, a stream keeps its file
                if part.kind == "final":
                    part.abort()
                else:
                    part.finish_stream()
            self._slots.release()

    def _refuse(self, sock: socket.socket, who: str, reason: str) -> None:
        """One line to the log and to the client, then what it still sends is read and dropped
        (``DRAIN_BYTES`` at most, ``DRAIN_S`` at most) so that the close is orderly: closing with
        unread bytes would reset the connection, and the client might never read the line."""
        self.log(f"memwarden: refused {who}: {reason}")
        try:
            sock.sendall(f"error: {reason}\n".encode())
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(DRAIN_S)
            drained = 0
            while drained < DRAIN_BYTES and (data := sock.recv(RECV_BYTES)):
                drained += len(data)
        except OSError:
            pass
