"""The adapter sync server (aiohttp): publishes manifests, tensors by digest, and deltas.

    GET /v1/adapters                                 {"adapters": [names]}
    GET /v1/adapters/{name}/manifest[?version=N]     the manifest JSON (latest by default)
    GET /v1/tensors/{digest}                         one tensor's raw bytes         (Range)
    GET /v1/adapters/{name}/delta?from=N[&to=M]      a delta file from v N          (Range)

Bodies that a device may need to resume honour a single ``Range: bytes=START-[END]`` with
``206 Partial Content`` and ``Content-Range``. ``bytes_sent`` counts every body byte written,
which is what the sync benchmark compares with a full transfer.

Manifests are served as the publisher signed them (the server holds no key). Everything a
request carries is bounded before it is used: request lines and headers by aiohttp's limits
(8 KiB a line, 128 headers), numbers (``Range``, ``version``, ``from``, ``to``) to 1-19 digits by
the patterns below, so a 5,000-digit ``Range`` is a 416, never a 500.
"""

from __future__ import annotations

import re

from aiohttp import web

from memwarden.edge.sync.store import AdapterStore, check_adapter_name
from memwarden.errors import InputError

__all__ = ["SyncServer"]

_RANGE = re.compile(r"^bytes=(\d{1,19})-(\d{0,19})$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_VERSION = re.compile(r"^\d{1,12}$")


def _version(text: str | None) -> int | None:
    if text is None:
        return None
    if not _VERSION.match(text):
        raise ValueError("a version is 1 to 12 digits")
    return int(text)


class SyncServer:
    """Serve ``store`` on ``host:port`` (port 0: the OS picks one; see ``port`` after ``start``)."""

    def __init__(self, store: AdapterStore, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.store = store
        self.host, self.port = host, port
        self.bytes_sent = 0
        self.requests = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.add_routes(
            [
                web.get("/v1/adapters", self._adapters),
                web.get("/v1/adapters/{name}/manifest", self._manifest),
                web.get("/v1/adapters/{name}/delta", self._delta),
                web.get("/v1/tensors/{digest}", self._tensor),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]  # the port the OS chose; a restart binds it again

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- handlers -----------------------------------------------------------------------------

    def _body(self, request: web.Request, data: bytes, content_type: str) -> web.Response:
        self.requests += 1
        header = request.headers.get("Range")
        if header is None:
            self.bytes_sent += len(data)
            return web.Response(body=data, content_type=content_type)
        match = _RANGE.match(header.strip())
        start = int(match.group(1)) if match else -1
        end = int(match.group(2)) + 1 if match and match.group(2) else len(data)
        if not match or start >= len(data) or end <= start:
            return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        end = min(end, len(data))
        self.bytes_sent += end - start
        return web.Response(
            status=206,
            body=data[start:end],
            content_type=content_type,
            headers={"Content-Range": f"bytes {start}-{end - 1}/{len(data)}"},
        )

    async def _adapters(self, request: web.Request) -> web.Response:
        self.requests += 1
        return web.json_response({"adapters": self.store.adapters()})

    async def _manifest(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            check_adapter_name(name)
            data = self.store.signed_manifest(name, _version(request.query.get("version")))
        except (KeyError, ValueError, InputError):
            raise web.HTTPNotFound(text=f"no adapter {name[:80]!r} at that version") from None
        return self._body(request, data, "application/json")

    async def _tensor(self, request: web.Request) -> web.Response:
        digest = request.match_info["digest"]
        if not _DIGEST.match(digest):
            raise web.HTTPBadRequest(text="a tensor digest is 64 hex digits")
        try:
            data = self.store.tensor(digest).data
        except KeyError:
            raise web.HTTPNotFound(text=f"no tensor {digest}") from None
        return self._body(request, data, "application/octet-stream")

    async def _delta(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            check_adapter_name(name)
            start = _version(request.query.get("from"))
            if start is None:
                raise KeyError("from")
            data = self.store.delta(name, start, _version(request.query.get("to")))
        except (KeyError, ValueError, InputError):
            raise web.HTTPNotFound(text=f"no delta of {name[:80]!r} between those versions") from None
        return self._body(request, data, "application/octet-stream")
