"""``memwarden trace --sink ADDR``: the trace leaves the container as it is made.

An orchestrator that kills a container (Kubernetes, Docker's ``--memory``, a systemd slice) kills
the supervisor together with the script, and the trace file dies with the container's disk. With
a sink, the supervisor forwards the stream to a place outside: a collector
(``memwarden collect``, ``record/live/collector.py``) over loopback TCP or a Unix socket, or a
directory on a mounted volume. What reaches it before the kill is a loadable ``.mwtrace`` stream
(``memwarden.load`` reads every whole chunk; ``metadata.recovered.complete`` false says it was
cut off); a run that ends normally sends its complete trace last, which replaces the stream.

Why the supervisor forwards (and not the traced process): the stream file is already the
buffer, so the supervisor only tails it (``POLL_S``) and sends the new bytes. The traced
program never waits on the network, a slow or absent collector costs it nothing, memory stays
bounded (``BLOCK_BYTES`` at a time, whatever the stream's size), and nothing in the recorder
changes. The price is latency: a group kill loses the child's unflushed interval (100 ms) plus
at most one poll (``POLL_S``) of forwarding.

The wire: each connection sends one line ``MWSINK1 {json}\\n`` (at most ``HEADER_LIMIT`` bytes;
``kind`` "stream" or "final", the ``run`` id, the script's ``name``, the ``part`` number, and
``initial``/``size`` bytes), reads one reply line (``ok ...`` or ``error: ...``), then sends the
file's bytes. A stream part starts from byte 0: a new part (the flight recorder rewrote the
stream, or the connection was lost and made again) replaces the last one at the collector once
its first ``initial`` bytes (a whole header and chunks) have arrived. A ``final`` part replaces
the run's file once all ``size`` bytes have arrived.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from memwarden.record.live.collector import RunStore
from memwarden.record.live.wire import REPLY_LIMIT, SinkAddress, SinkError, encode_header, read_line, safe_name
from memwarden.trace.stream import STREAM_MAGIC

__all__ = ["Forwarder"]

POLL_S = 0.05  # how often the supervisor looks for new stream bytes
BLOCK_BYTES = 1 << 20  # the most the forwarder holds at once
CONNECT_TIMEOUT_S = 5.0
SEND_TIMEOUT_S = 30.0  # a collector that takes no byte for this long is dropped (and retried)
RETRY_S = 1.0  # after a lost connection, the next part waits this long


class Channel(Protocol):
    """One part on its way: bytes in order, then ``close`` (which returns the sink's last word)."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> str: ...


class _SocketChannel:
    def __init__(self, address: SinkAddress, header: dict[str, Any]) -> None:
        if address.kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = address.path
        else:
            sock = None
            target = (address.host, address.port)
        try:
            if sock is None:
                sock = socket.create_connection(target, timeout=CONNECT_TIMEOUT_S)
            else:
                sock.settimeout(CONNECT_TIMEOUT_S)
                sock.connect(target)
            sock.sendall(encode_header(header))
            reply = read_line(sock, REPLY_LIMIT)
        except OSError as exc:
            if sock is not None:
                sock.close()
            raise SinkError(f"sink {address}: {exc.strerror or exc}") from None
        if not reply.startswith("ok"):
            sock.close()
            raise SinkError(f"sink {address} refused: {reply or 'no answer'}")
        sock.settimeout(SEND_TIMEOUT_S)
        self._sock = sock
        self._address = address

    def write(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise SinkError(f"sink {self._address}: {exc.strerror or exc}") from None

    def close(self) -> str:
        """Half-close and read the collector's last line (what it stored)."""
        try:
            self._sock.shutdown(socket.SHUT_WR)
            return read_line(self._sock, REPLY_LIMIT)
        except OSError:
            return ""
        finally:
            self._sock.close()


def open_channel(address: SinkAddress, header: dict[str, Any]) -> Channel:
    if address.kind == "dir":
        store = RunStore(Path(address.path))
        try:
            return store.open(header)
        except ValueError as exc:
            raise SinkError(f"sink {address}: {exc}") from None
    return _SocketChannel(address, header)


class Forwarder:
    """Tails the stream at ``path`` and forwards it to ``address`` from a thread of its own;
    ``finish`` sends the complete trace. Never raises into the supervisor: a sink that fails is
    retried every ``RETRY_S``, and ``problems`` keeps the first line of what went wrong."""

    def __init__(self, address: SinkAddress, path: Path, name: str) -> None:
        self.address = address
        self.path = path
        self.name = safe_name(name)
        self.run_id = secrets.token_hex(8)
        self.parts = 0
        self.bytes_sent = 0
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fd = -1
        self._ino = -1
        self._offset = 0
        self._channel: Channel | None = None
        self._retry_at = 0.0

    def check(self) -> None:
        """Before the script runs: the sink answers (raises ``SinkError`` with one line if not)."""
        if self.address.kind == "dir":
            RunStore(Path(self.address.path)).check()
            return
        channel = open_channel(self.address, {"kind": "hello", "run": self.run_id, "name": self.name})
        channel.close()

    def metadata(self) -> dict[str, Any]:
        return {"address": str(self.address), "run": self.run_id, "file": f"{self.name}-{self.run_id}.mwtrace"}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="memwarden-sink", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll()

    def poll(self) -> None:
        """Send what the stream gained; start a new part when the stream was replaced."""
        try:
            self._poll()
        except SinkError as exc:
            self._drop(str(exc))
        except OSError as exc:  # the stream file itself (a vanished folder): try again later
            self._drop(f"stream {self.path}: {exc.strerror or exc}")

    def _poll(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        if st.st_ino != self._ino:
            if time.monotonic() < self._retry_at:
                return
            self._begin(st.st_ino)
        self._send_new()

    def _begin(self, ino: int) -> None:
        self._close_channel()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        head = os.pread(fd, len(STREAM_MAGIC), 0)
        if head != STREAM_MAGIC:  # not (yet, or no longer) a stream: the complete trace goes in finish
            os.close(fd)
            if len(head) == len(STREAM_MAGIC):  # a short head is a stream still being begun: look again
                self._ino = ino
            return
        self._fd, self._ino, self._offset = fd, os.fstat(fd).st_ino, 0
        size = os.fstat(fd).st_size
        self.parts += 1
        header = {"kind": "stream", "run": self.run_id, "name": self.name, "part": self.parts, "initial": size}
        self._channel = open_channel(self.address, header)

    def _send_new(self) -> None:
        if self._channel is None or self._fd < 0:
            return
        while True:
            data = os.pread(self._fd, BLOCK_BYTES, self._offset)
            if not data:
                return
            self._channel.write(data)
            self._offset += len(data)
            self.bytes_sent += len(data)

    def _drop(self, problem: str) -> None:
        if not self.problems or self.problems[-1] != problem:
            self.problems.append(problem)
            del self.problems[:-8]
        self._close_channel()
        self._ino = -1  # the next poll starts a new part from byte 0
        self._retry_at = time.monotonic() + RETRY_S

    def _close_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def finish(self, trace_path: Path) -> str:
        """Stop tailing and send the complete trace at ``trace_path``; one line saying what the
        sink holds now, or the problem."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._close_channel()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            size = os.path.getsize(trace_path)
            channel = open_channel(
                self.address,
                {"kind": "final", "run": self.run_id, "name": self.name, "part": self.parts + 1, "size": size},
            )
            with open(trace_path, "rb") as fh:
                while block := fh.read(BLOCK_BYTES):
                    channel.write(block)
            answer = channel.close()
        except (SinkError, OSError) as exc:
            return str(exc) if isinstance(exc, SinkError) else f"sink {self.address}: {exc.strerror or exc}"
        if answer.startswith("ok"):
            return f"sink {self.address} holds {answer[2:].strip() or 'the trace'}"
        return f"sink {self.address}: {answer or 'no answer after the trace was sent'}"
