"""The wire between ``memwarden trace --sink`` (``sink.py``) and ``memwarden collect``
(``collector.py``): addresses, the header line, names a run may have. See ``sink.py`` for the
protocol and why it is shaped so.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "HEADER_LIMIT",
    "NAME_RE",
    "REPLY_LIMIT",
    "RUN_RE",
    "SINK_MAGIC",
    "SinkAddress",
    "SinkError",
    "encode_header",
    "read_line",
    "safe_name",
]

SINK_MAGIC = b"MWSINK1 "
HEADER_LIMIT = 4096  # the header line, magic and newline included
REPLY_LIMIT = 512
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
RUN_RE = re.compile(r"[0-9a-f]{16,64}")


class SinkError(Exception):
    """A sink that cannot be used (an address, a refused connection); one line."""


def safe_name(text: str) -> str:
    """A script's stem as a run name: the characters a file name may hold, at most 64."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:64].lstrip(".-") or "run"
    return name if NAME_RE.fullmatch(name) else "run"


@dataclass(frozen=True)
class SinkAddress:
    """Where a trace goes: ``kind`` "tcp" (host, port), "unix" (path) or "dir" (path)."""

    kind: str
    host: str = ""
    port: int = 0
    path: str = ""

    @classmethod
    def parse(cls, text: str, *, listening: bool = False) -> SinkAddress:
        """``tcp://HOST:PORT``, ``HOST:PORT``, ``[::1]:PORT``, ``unix:PATH``, or (not for a
        listener) a directory. ``listening`` allows port 0 (any free port)."""
        if text.startswith("unix:"):
            path = text[len("unix:") :]
            if not path or "\0" in path or len(os.fsencode(path)) > 107:
                raise SinkError(f"{text!r}: give unix:PATH with a socket path of at most 107 bytes")
            return cls("unix", path=path)
        rest = text[len("tcp://") :] if text.startswith("tcp://") else text
        if not listening and "://" not in text and Path(text).is_dir():
            return cls("dir", path=text)
        host, sep, port_text = rest.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not port_text.isdigit() or not (0 if listening else 1) <= int(port_text) <= 65535:
            what = "HOST:PORT or unix:PATH" if listening else "HOST:PORT, unix:PATH or an existing directory"
            raise SinkError(f"{text!r}: expected {what}")
        return cls("tcp", host=host or "127.0.0.1", port=int(port_text))

    def is_loopback(self) -> bool:
        if self.kind != "tcp":
            return True
        try:
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except OSError:
            return False
        return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)

    def __str__(self) -> str:
        if self.kind == "tcp":
            host = f"[{self.host}]" if ":" in self.host else self.host
            return f"tcp://{host}:{self.port}"
        return f"unix:{self.path}" if self.kind == "unix" else self.path


def encode_header(header: dict[str, Any]) -> bytes:
    line = SINK_MAGIC + json.dumps(header, separators=(",", ":")).encode() + b"\n"
    if len(line) > HEADER_LIMIT:
        raise SinkError("sink header too long")
    return line


def read_line(sock: socket.socket, limit: int) -> str:
    """One line of at most ``limit`` bytes (a byte at a time: nothing past it is consumed)."""
    got = bytearray()
    while len(got) < limit:
        b = sock.recv(1)
        if not b or b == b"\n":
            break
        got += b
    return got.decode("utf-8", "replace").strip()
