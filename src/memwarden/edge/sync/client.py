"""The device side of adapter sync: pull the manifest, fetch only what differs, verify it all.

``SyncClient.pull(name, have)`` compares the server's latest manifest with ``have`` (what the
device holds) and fetches only the tensors whose digests differ, by digest. A transfer that
breaks off (a dropped connection, a truncated body, a server restart) resumes where it stopped
with an HTTP ``Range`` request; one whose bytes fail their BLAKE2b digest is thrown away and
fetched again from the start. Nothing reaches the caller unverified: the result is a
:class:`Delta` whose every tensor matches the manifest, and the manifest its own digests. A
pull that cannot complete within ``max_attempts`` per body raises ``SyncError`` and leaves the
device as it was — there is nothing half-applied to undo, because nothing was applied.

The transport is a parameter (``Transport``: one ``get`` per request) so faults can be
injected between the client and a real server (``edge/sync/faults.py``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from memwarden.edge.sync.delta import Delta, check_tensors, read_delta
from memwarden.edge.sync.manifest import AdapterFormatError, Manifest, RawTensor, digest_bytes
from memwarden.errors import MemwardenError

__all__ = ["AiohttpTransport", "Response", "SyncClient", "SyncError", "SyncStats", "Transport", "TransportError"]

T = TypeVar("T")
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")


class SyncError(MemwardenError):
    """A pull that could not complete; the device keeps the version it holds."""


class TransportError(Exception):
    """The connection failed; ``partial`` holds the body bytes that arrived before it did."""

    def __init__(self, message: str, partial: bytes = b"") -> None:
        super().__init__(message)
        self.partial = partial


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes


class Transport(Protocol):
    async def get(self, path: str, headers: Mapping[str, str]) -> Response: ...


class AiohttpTransport:
    """HTTP over aiohttp. A body that breaks off raises ``TransportError`` with what arrived."""

    def __init__(
        self, base_url: str, *, timeout_s: float = 30.0, chunk_bytes: int = 1 << 16, max_body_bytes: int = 1 << 32
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.chunk_bytes = chunk_bytes
        self.max_body_bytes = max_body_bytes  # a server that sends more is cut off (memory on a device)
        self._session: object | None = None

    async def get(self, path: str, headers: Mapping[str, str]) -> Response:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        session = self._session
        assert isinstance(session, aiohttp.ClientSession)
        received = bytearray()
        try:
            async with session.get(self.base_url + path, headers=dict(headers)) as resp:
                async for chunk in resp.content.iter_chunked(self.chunk_bytes):
                    received += chunk
                    if len(received) > self.max_body_bytes:
                        raise TransportError(f"body over {self.max_body_bytes} bytes", b"")
                return Response(resp.status, dict(resp.headers), bytes(received))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}", bytes(received)) from None

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            import aiohttp

            assert isinstance(session, aiohttp.ClientSession)
            await session.close()


@dataclass
class SyncStats:
    requests: int = 0
    bytes_received: int = 0  # body bytes, all attempts
    resumed: int = 0  # transfers continued with a Range request
    short_bodies: int = 0  # a body shorter than promised (truncated): kept, resumed
    digest_failures: int = 0  # bodies (manifests, tensors, deltas) that failed verification: discarded
    connection_errors: int = 0
    bad_responses: int = 0  # unexpected status or Content-Range
    tensors_fetched: int = 0
    pulls: int = 0
    failed_pulls: int = 0

    @property
    def detected(self) -> int:
        return self.short_bodies + self.digest_failures + self.connection_errors + self.bad_responses


@dataclass(frozen=True)
class PullPlan:
    manifest: Manifest
    fetch: list[str] = field(default_factory=list)  # tensor names whose content differs


class SyncClient:
    def __init__(
        self,
        transport: Transport,
        *,
        max_attempts: int = 20,
        backoff_s: Callable[[int], float] = lambda attempt: min(0.05 * attempt, 1.0),
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        self.transport = transport
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self._sleep = sleep
        self.stats = SyncStats()

    async def manifest(self, name: str) -> Manifest:
        """The server's latest manifest of ``name``, its digests verified."""
        return await self._fetch(f"/v1/adapters/{name}/manifest", None, Manifest.from_bytes, resumable=False)

    async def plan(self, name: str, have: Manifest | None) -> PullPlan:
        latest = await self.manifest(name)
        return PullPlan(latest, [t.name for t in latest.changed_from(have)])

    async def pull(self, name: str, have: Manifest | None) -> Delta | None:
        """The delta from ``have`` to the server's latest version, every byte verified; None when
        the device is up to date. Raises ``SyncError`` after ``max_attempts`` on one body."""
        self.stats.pulls += 1
        try:
            plan = await self.plan(name, have)
            if have is not None and plan.manifest.content_digest == have.content_digest:
                return None
            entries = plan.manifest.by_name
            tensors: dict[str, RawTensor] = {}
            for tensor_name in plan.fetch:
                entry = entries[tensor_name]

                def verify(data: bytes, digest: str = entry.digest) -> bytes:
                    if digest_bytes(data) != digest:
                        raise AdapterFormatError("tensor digest mismatch")
                    return data

                data = await self._fetch(f"/v1/tensors/{entry.digest}", entry.nbytes, verify, resumable=True)
                tensors[tensor_name] = RawTensor(dtype=entry.dtype, shape=entry.shape, data=data)
                self.stats.tensors_fetched += 1
            check_tensors(plan.manifest, tensors)  # again, as a whole: nothing unverified leaves
        except SyncError:
            self.stats.failed_pulls += 1
            raise
        base = have.content_digest if have is not None else ""
        return Delta(
            base_digest=base,
            base_version=have.version if have is not None else -1,
            manifest=plan.manifest,
            tensors=tensors,
        )

    async def pull_delta(self, name: str, have: Manifest) -> Delta:
        """The server-made delta from ``have.version`` (one resumable body), verified."""
        self.stats.pulls += 1
        try:
            delta = await self._fetch(
                f"/v1/adapters/{name}/delta?from={have.version}", None, read_delta, resumable=True
            )
        except SyncError:
            self.stats.failed_pulls += 1
            raise
        if delta.base_digest != have.content_digest:
            self.stats.failed_pulls += 1
            raise SyncError(f"the server's v{have.version} of {name} is not what this device holds")
        return delta

    # -- one body, resumed and verified ----------------------------------------------------

    async def _fetch(self, path: str, expected_len: int | None, verify: Callable[[bytes], T], *, resumable: bool) -> T:
        """GET ``path`` until ``verify(body)`` passes. With ``resumable``, a body that breaks off is
        continued from where it stopped (Range); a body that fails ``verify`` is dropped whole."""
        received = b""
        total = expected_len
        last = "no attempt"
        for attempt in range(1, self.max_attempts + 1):
            headers = {"Range": f"bytes={len(received)}-"} if resumable and received else {}
            if headers:
                self.stats.resumed += 1
            self.stats.requests += 1
            try:
                resp = await self.transport.get(path, headers)
            except TransportError as exc:
                self.stats.connection_errors += 1
                self.stats.bytes_received += len(exc.partial)
                if resumable and exc.partial:  # kept even unverified: the digest at the end judges it all
                    received = received + exc.partial
                    received = received if total is None else received[:total]
                last = str(exc)
                await self._pause(attempt)
                continue
            self.stats.bytes_received += len(resp.body)
            if resp.status == 206 and headers:
                match = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
                if not match or int(match.group(1)) != len(received):
                    self.stats.bad_responses += 1
                    received, last = b"", "a range that does not continue the body"
                    continue
                total = int(match.group(3)) if total is None else total
                body = received + resp.body
            elif resp.status == 200:
                body = resp.body
                length = resp.headers.get("Content-Length", "")
                if total is None and length.isdigit():
                    total = int(length)
            else:
                self.stats.bad_responses += 1
                received, last = b"", f"HTTP {resp.status}"
                await self._pause(attempt)
                continue
            if total is not None and len(body) < total and resumable:
                self.stats.short_bodies += 1
                received, last = body, "short body"
                continue
            try:
                return verify(body)
            except AdapterFormatError as exc:
                self.stats.digest_failures += 1
                received, last = b"", str(exc)
        raise SyncError(f"GET {path}: gave up after {self.max_attempts} attempts ({last})")

    async def _pause(self, attempt: int) -> None:
        delay = self.backoff_s(attempt)
        if delay <= 0:
            return
        if self._sleep is not None:
            self._sleep(delay)
        else:
            await asyncio.sleep(delay)
