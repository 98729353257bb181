"""The device side of adapter sync: pull the manifest, fetch only what differs, verify it all.

``SyncClient.pull(name, have)`` compares the server's latest manifest with ``have`` (what the
device holds) and fetches only the tensors whose digests differ, by digest. A transfer that
breaks off (a dropped connection, a truncated body, a server restart) resumes where it stopped
with an HTTP ``Range`` request; one whose bytes fail their BLAKE2b digest is thrown away and
fetched again from the start. Nothing reaches the caller unverified: the result is a
:class:`Delta` whose every tensor matches the manifest, and the manifest its own digests. A
pull that cannot complete within ``max_attempts`` per body raises ``SyncError`` and leaves the
device as it was — there is nothing half-applied to undo, because nothing was applied.

Trust: the client pins the publisher's Ed25519 public key (``publisher_key``, required). A
manifest, or a delta's manifest, that is unsigned or signed by another key is refused at once
(``SignatureError``, not retried), as is a verified update that would take the device backwards
(a lower version, or the same version with other content), that is another adapter's, or whose
tensors change shape beyond a LoRA rank (``UpdateRefused``). Either way nothing was applied.

Limits: every body is bounded before it is read whole (a manifest ``max_manifest_bytes``, a
tensor exactly its manifest size, a delta ``max_delta_bytes``; ``Content-Length`` and
``Content-Range`` are checked against the bound first), response headers by aiohttp's limits,
shapes by ``manifest.numel`` before any product; each request has connect and read timeouts,
and each transfer (all its attempts) ``transfer_timeout_s`` in total, which cancels it.

The transport is a parameter (``Transport``: one ``get`` per request) so faults can be
injected between the client and a real server (``edge/sync/faults.py``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from memwarden.edge.sync.delta import Delta, check_shapes, check_tensors, read_delta
from memwarden.edge.sync.errors import SignatureError, SyncError, UpdateRefused
from memwarden.edge.sync.manifest import MAX_HEADER_BYTES, AdapterFormatError, Manifest, RawTensor, digest_bytes
from memwarden.edge.sync.signing import PublicKey, verify_manifest
from memwarden.errors import MemwardenError

__all__ = ["AiohttpTransport", "Response", "SyncClient", "SyncStats", "Transport", "TransportError"]

T = TypeVar("T")
_CONTENT_RANGE = re.compile(r"^bytes (\d{1,19})-(\d{1,19})/(\d{1,19})$")
_LENGTH = re.compile(r"^\d{1,19}$")


class TransportError(MemwardenError):
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
    async def get(self, path: str, headers: Mapping[str, str], *, limit: int | None = None) -> Response:
        """One GET; a body over ``limit`` bytes is cut off (``TransportError``, nothing kept)."""
        ...


class AiohttpTransport:
    """HTTP over aiohttp. A body that breaks off raises ``TransportError`` with what arrived.
    ``timeout_s`` bounds a request, ``connect_timeout_s`` its connection, ``read_timeout_s``
    each wait for bytes; response lines and headers are bounded by aiohttp (8 KiB, 64 headers);
    bodies by ``max_body_bytes`` and the caller's ``limit``, ``Content-Length`` checked first."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 30.0,
        chunk_bytes: int = 1 << 16,
        max_body_bytes: int = 1 << 30,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 15.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.chunk_bytes = chunk_bytes
        self.max_body_bytes = max_body_bytes  # a server that sends more is cut off (memory on a device)
        self._session: object | None = None

    async def get(self, path: str, headers: Mapping[str, str], *, limit: int | None = None) -> Response:
        import aiohttp

        if self._session is None:
            timeout = aiohttp.ClientTimeout(
                total=self.timeout_s, sock_connect=self.connect_timeout_s, sock_read=self.read_timeout_s
            )
            self._session = aiohttp.ClientSession(
                timeout=timeout, auto_decompress=False, max_line_size=8190, max_field_size=8190, max_headers=64
            )
        session = self._session
        assert isinstance(session, aiohttp.ClientSession)
        cap = self.max_body_bytes if limit is None else min(limit, self.max_body_bytes)
        received = bytearray()
        try:
            async with session.get(self.base_url + path, headers=dict(headers), allow_redirects=False) as resp:
                length = resp.headers.get("Content-Length", "")
                if _LENGTH.match(length) and int(length) > cap:
                    raise TransportError(f"a body of {length} bytes is over the {cap}-byte limit", b"")
                async for chunk in resp.content.iter_chunked(self.chunk_bytes):
                    received += chunk
                    if len(received) > cap:
                        raise TransportError(f"body over {cap} bytes", b"")
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
    refused: int = 0  # whole bodies refused for good: bad signature, version backwards, shape changed
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
    signed: bytes = b""  # the manifest as the publisher signed it


class SyncClient:
    """Pulls adapters signed by the publisher whose public key is ``publisher_key`` (64 hex
    digits, ``ed25519:...``, a key file, or a ``PublicKey``); there is no unsigned mode."""

    def __init__(
        self,
        transport: Transport,
        *,
        publisher_key: PublicKey | str | bytes | None = None,
        max_attempts: int = 20,
        backoff_s: Callable[[int], float] = lambda attempt: min(0.05 * attempt, 1.0),
        sleep: Callable[[float], object] | None = None,
        transfer_timeout_s: float = 600.0,
        max_manifest_bytes: int = MAX_HEADER_BYTES,
        max_delta_bytes: int = 1 << 30,
    ) -> None:
        if publisher_key is None:
            raise SyncError(
                "SyncClient needs the publisher's public key (publisher_key='ed25519:<64 hex>' or a key file, "
                "as `memwarden lora keygen` prints it): updates are verified against it"
            )
        self.publisher_key = PublicKey.parse(publisher_key)
        self.transport = transport
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self._sleep = sleep
        self.transfer_timeout_s = transfer_timeout_s
        self.max_manifest_bytes = max_manifest_bytes
        self.max_delta_bytes = max_delta_bytes
        self.stats = SyncStats()

    async def manifest(self, name: str) -> Manifest:
        """The server's latest manifest of ``name``, its digests and publisher signature verified."""
        return (await self._signed_manifest(name))[0]

    async def _signed_manifest(self, name: str) -> tuple[Manifest, bytes]:
        def verify(data: bytes) -> tuple[Manifest, bytes]:
            return verify_manifest(data, self.publisher_key, max_bytes=self.max_manifest_bytes), data

        return await self._fetch(
            f"/v1/adapters/{name}/manifest", None, verify, resumable=False, limit=self.max_manifest_bytes
        )

    async def plan(self, name: str, have: Manifest | None) -> PullPlan:
        latest, signed = await self._signed_manifest(name)
        return PullPlan(latest, [t.name for t in latest.changed_from(have)], signed)

    async def pull(self, name: str, have: Manifest | None) -> Delta | None:
        """The delta from ``have`` to the server's latest version, every byte verified; None when
        the device is up to date. Raises ``SyncError`` after ``max_attempts`` on one body,
        ``SignatureError``/``UpdateRefused`` (both ``SyncError``) for an update it must not apply."""
        self.stats.pulls += 1
        try:
            plan = await self.plan(name, have)
            if not self._admit(name, plan.manifest, have):
                return None
            entries = plan.manifest.by_name
            tensors: dict[str, RawTensor] = {}
            for tensor_name in plan.fetch:
                entry = entries[tensor_name]

                def verify(data: bytes, digest: str = entry.digest) -> bytes:
                    if digest_bytes(data) != digest:
                        raise AdapterFormatError("tensor digest mismatch")
                    return data

                data = await self._fetch(
                    f"/v1/tensors/{entry.digest}", entry.nbytes, verify, resumable=True, limit=entry.nbytes
                )
                tensors[tensor_name] = RawTensor(dtype=entry.dtype, shape=entry.shape, data=data)
                self.stats.tensors_fetched += 1
            check_tensors(plan.manifest, tensors)  # again, as a whole: nothing unverified leaves
        except SyncError as exc:
            self._failed(exc)
            raise
        base = have.content_digest if have is not None else ""
        return Delta(
            base_digest=base,
            base_version=have.version if have is not None else -1,
            manifest=plan.manifest,
            tensors=tensors,
            signed_manifest=plan.signed,
        )

    async def pull_delta(self, name: str, have: Manifest) -> Delta:
        """The server-made delta from ``have.version`` (one resumable body), verified: its
        manifest signed by the publisher, every tensor's digest, and the update admissible."""
        self.stats.pulls += 1

        def verify(data: bytes) -> Delta:
            delta = read_delta(data, publisher_key=self.publisher_key)
            if delta.base_digest != have.content_digest:  # unsigned field: a damaged one is fetched again
                raise AdapterFormatError(
                    f"the server's delta from v{have.version} of {name} is not from what this device holds"
                )
            return delta

        try:
            delta = await self._fetch(
                f"/v1/adapters/{name}/delta?from={have.version}",
                None,
                verify,
                resumable=True,
                limit=self.max_delta_bytes,
            )
            self._admit(name, delta.manifest, have)  # False (same content) is still a new version to apply
            if delta.manifest.version <= have.version:
                raise UpdateRefused(
                    f"the delta of {name} leads to v{delta.manifest.version}, not above v{have.version}"
                )
        except SyncError as exc:
            self._failed(exc)
            raise
        return delta

    def _admit(self, name: str, latest: Manifest, have: Manifest | None) -> bool:
        """Whether ``latest`` (verified) is an update to apply over ``have``: False when there is
        nothing to do, ``UpdateRefused`` when it must never be applied."""
        if latest.adapter != name:
            raise UpdateRefused(f"asked for {name!r}, the server sent a manifest of {latest.adapter[:80]!r}: refused")
        if have is None:
            return True
        if latest.version < have.version:
            raise UpdateRefused(
                f"the server offers {name} v{latest.version}, older than the v{have.version} this device holds: "
                "versions never go backwards, refused"
            )
        if latest.content_digest == have.content_digest:
            return False
        if latest.version == have.version:
            raise UpdateRefused(f"the server's {name} v{latest.version} differs from the v{have.version} held: refused")
        try:
            check_shapes(latest, have, allow_rank=True)
        except AdapterFormatError as exc:
            raise UpdateRefused(f"{name} v{latest.version}: {exc}") from None
        return True

    def _failed(self, exc: SyncError) -> None:
        self.stats.failed_pulls += 1
        if isinstance(exc, SignatureError | UpdateRefused):
            self.stats.refused += 1

    # -- one body, resumed and verified ----------------------------------------------------

    async def _fetch(
        self, path: str, expected_len: int | None, verify: Callable[[bytes], T], *, resumable: bool, limit: int
    ) -> T:
        """``_attempts`` within ``transfer_timeout_s`` in all: a transfer past it is cancelled."""
        try:
            return await asyncio.wait_for(
                self._attempts(path, expected_len, verify, resumable=resumable, limit=limit), self.transfer_timeout_s
            )
        except asyncio.TimeoutError:
            raise SyncError(f"GET {path}: not complete within {self.transfer_timeout_s:g} s, given up") from None

    async def _attempts(
        self, path: str, expected_len: int | None, verify: Callable[[bytes], T], *, resumable: bool, limit: int
    ) -> T:
        """GET ``path`` until ``verify(body)`` passes. With ``resumable``, a body that breaks off is
        continued from where it stopped (Range); a body that fails ``verify`` is dropped whole.
        No body, nor what is kept of broken ones, grows past ``limit`` bytes."""
        received = b""
        total = expected_len
        last = "no attempt"
        for attempt in range(1, self.max_attempts + 1):
            headers = {"Range": f"bytes={len(received)}-"} if resumable and received else {}
            if headers:
                self.stats.resumed += 1
            self.stats.requests += 1
            try:
                resp = await self.transport.get(path, headers, limit=limit - len(received))
            except TransportError as exc:
                self.stats.connection_errors += 1
                self.stats.bytes_received += len(exc.partial)
                if resumable and exc.partial:  # kept even unverified: the digest at the end judges it all
                    received = received + exc.partial
                    received = received if total is None else received[:total]
                    received = received if len(received) < limit else b""
                last = str(exc)
                await self._pause(attempt)
                continue
            self.stats.bytes_received += len(resp.body)
            if resp.status == 206 and headers:
                match = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
                if not match or int(match.group(1)) != len(received) or int(match.group(3)) > limit:
                    self.stats.bad_responses += 1
                    received, last = b"", "a range that does not continue the body"
                    continue
                total = int(match.group(3)) if total is None else total
                body = received + resp.body
            elif resp.status == 200:
                body = resp.body
                length = resp.headers.get("Content-Length", "")
                if total is None and _LENGTH.match(length) and int(length) <= limit:
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
