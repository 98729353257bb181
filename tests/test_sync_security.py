"""Adapter sync against an attacker: forged, replayed, reshaped and hostile updates over real HTTP on
127.0.0.1 are refused with one error, the device keeps the adapter it had, publishing never loses
an upload, and the server answers hostile requests without a traceback. A bounded fuzz campaign
(benchmarks/bench_fuzz_sync.py runs 10,000+)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp import web

from _lora_models import adapter_state, changed, file_of, peft_stack
from memwarden.edge.sync.client import AiohttpTransport, SyncClient
from memwarden.edge.sync.delta import read_delta
from memwarden.edge.sync.errors import SignatureError, SyncError, UpdateRefused
from memwarden.edge.sync.manifest import AdapterFormatError, Manifest, _doc_digest
from memwarden.edge.sync.server import SyncServer
from memwarden.edge.sync.signing import SigningKey, sign_manifest, verify_manifest
from memwarden.edge.sync.store import AdapterStore
from memwarden.runtime.lora.slot import AdapterSlot

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_fuzz_sync  # noqa: E402

KEY, ATTACKER = SigningKey.generate(), SigningKey.generate()
NO_WAIT: dict[str, Any] = {"backoff_s": lambda attempt: 0.0, "publisher_key": KEY.public_key}
X = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))


def _run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())


class _Hostile:
    """A real HTTP server on 127.0.0.1 that answers as an attacker chooses."""

    def __init__(self, routes: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]]) -> None:
        app = web.Application()
        app.add_routes([web.get(path, handler) for path, handler in routes.items()])
        self.runner = web.AppRunner(app, access_log=None)
        self.url = ""

    async def __aenter__(self) -> _Hostile:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


def _static(data: bytes) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=data, content_type="application/json")

    return handler


def _forged_v4(v0: dict[str, torch.Tensor], key: SigningKey | None) -> bytes:
    """The attacker's v4: lora_A set to 10000, its manifest's digests all correct, signed by ``key``."""
    from memwarden.edge.sync.delta import adapter_manifest

    evil = {k: (torch.full_like(v, 10000.0) if "lora_A" in k else v) for k, v in v0.items()}
    manifest, _ = adapter_manifest(file_of(evil), adapter="a", version=4)
    return sign_manifest(manifest, key) if key is not None else manifest.to_bytes()


def test_a_client_needs_the_publisher_key_and_a_store_needs_the_signing_key(tmp_path: Path) -> None:
    with pytest.raises(SyncError, match="publisher's public key"):
        SyncClient(AiohttpTransport("http://127.0.0.1:9"))
    with pytest.raises(Exception, match="signing key"):
        AdapterStore(tmp_path).publish("a", file_of(adapter_state(peft_stack())))


def test_forged_unsigned_replayed_and_reshaped_updates_are_refused_and_the_device_keeps_its_adapter(
    tmp_path: Path,
) -> None:
    """The device pulls v1 from the publisher, then every failing pull of the campaign (forged by
    another key, unsigned, a replayed older version, a tensor of another shape, an endless body,
    deep JSON, a server gone) leaves v1 in force, bit for bit; then the real v2 applies."""
    model = peft_stack()
    v0 = adapter_state(model)
    slot = AdapterSlot(model, adapter="a", version=0, publisher_key=KEY.public_key)
    store = AdapterStore(tmp_path / "store", signing_key=KEY)
    store.publish("a", file_of(v0))
    v1 = changed(v0, [1])
    store.publish("a", file_of(v1))
    reshaped = {**v1, "base_model.model.layers.2.lora_B.weight": torch.zeros(16, 4)}  # (32, 4) in v1
    for state in (changed(v1, [2]), changed(v1, [3])):
        store.publish("a", file_of(state))  # v2, v3
    store_b = AdapterStore(tmp_path / "b", signing_key=KEY)  # the publisher's other adapter line, for shapes
    store_b.publish("a", file_of(v0))
    store_b.publish("a", file_of(reshaped), version=5)  # newer than what the device will hold

    async def body() -> None:
        server = SyncServer(store)
        await server.start()
        transport = AiohttpTransport(server.url)
        try:
            client = SyncClient(transport, **NO_WAIT)
            first = await client.pull_delta("a", slot.manifest)  # v0 -> v3, signed
            slot.apply(first)
            assert slot.version == 3
            held, out = slot.held_manifest().content_digest, model(X)

            async def endless(request: web.Request) -> web.StreamResponse:
                resp = web.StreamResponse()
                await resp.prepare(request)
                for _ in range(4096):  # 256 MiB if nothing stops it
                    await resp.write(b"[" * 65536)
                return resp

            deep = ("[" * 200_000 + "]" * 200_000).encode()
            served = {
                "forged": _forged_v4(v0, ATTACKER),
                "unsigned": _forged_v4(v0, None),
                "replayed": store.signed_manifest("a", 1),  # the publisher's own, older than v3
                "reshaped": store_b.signed_manifest("a", 5),
                "deep": deep,
            }
            routes = {f"/{k}/v1/adapters/a/manifest": _static(v) for k, v in served.items()}
            routes["/endless/v1/adapters/a/manifest"] = endless
            async with _Hostile(routes) as hostile:
                for case, error, message in [
                    ("forged", SignatureError, "not signed by the pinned publisher key"),
                    ("unsigned", SignatureError, "is not signed"),
                    ("replayed", UpdateRefused, "never go backwards"),
                    ("reshaped", UpdateRefused, "shape"),
                    ("endless", SyncError, "gave up"),
                    ("deep", SyncError, "nested too deep"),
                ]:
                    url = f"{hostile.url}/{case}"
                    evil = SyncClient(AiohttpTransport(url), max_attempts=2, max_manifest_bytes=1 << 20, **NO_WAIT)
                    try:
                        with pytest.raises(error, match=message):
                            delta = await evil.pull("a", slot.manifest)
                            slot.apply(delta)  # never reached
                        assert evil.stats.bytes_received <= 2 * (1 << 20) + 65536, case
                    finally:
                        await evil.transport.close()  # type: ignore[attr-defined]
                    assert slot.version == 3 and slot.held_manifest().content_digest == held, case
                    with torch.no_grad():
                        assert torch.equal(model(X), out), case
            # A server that is gone: the pull fails, v3 stays.
            await server.stop()
            with pytest.raises(SyncError):
                await SyncClient(transport, max_attempts=2, **NO_WAIT).pull("a", slot.manifest)
            assert slot.held_manifest().content_digest == held
            # The publisher's real v4 applies.
            store.publish("a", file_of(changed(v1, [0], seed=9)))
            await server.start()
            delta = await client.pull("a", slot.manifest)
            assert delta is not None and delta.manifest.version == 4
            slot.apply(delta)
            assert slot.version == 4 and slot.held_manifest().content_digest == store.latest("a").content_digest
        finally:
            await transport.close()
            await server.stop()

    _run(body)


def test_a_delta_signed_by_another_key_is_refused_by_client_and_slot(tmp_path: Path) -> None:
    model = peft_stack()
    v0 = adapter_state(model)
    slot = AdapterSlot(model, adapter="a", version=0, publisher_key=KEY.public_key)
    evil_store = AdapterStore(tmp_path / "evil", signing_key=ATTACKER)
    evil_store.publish("a", file_of(v0))
    evil_store.publish("a", file_of(changed(v0, [0])))
    blob = evil_store.delta("a", 0)
    with pytest.raises(SignatureError):
        read_delta(blob, publisher_key=KEY.public_key)
    with pytest.raises(SignatureError):
        slot.apply(blob)
    unsigned = read_delta(blob)  # without a key it parses; the slot still wants a signed one
    with pytest.raises(SignatureError):
        slot.apply(type(unsigned)(unsigned.base_digest, unsigned.base_version, unsigned.manifest, unsigned.tensors))

    async def body() -> None:
        server = SyncServer(evil_store)
        await server.start()
        client = SyncClient(AiohttpTransport(server.url), **NO_WAIT)
        try:
            with pytest.raises(SignatureError):
                await client.pull_delta("a", slot.manifest)
            assert client.stats.requests == 1  # a forgery is not retried
        finally:
            await client.transport.close()  # type: ignore[attr-defined]
            await server.stop()

    _run(body)
    assert slot.version == 0 and slot.refused == 2


def test_concurrent_publishes_never_share_a_version_or_lose_an_upload(tmp_path: Path) -> None:
    """30 rounds of two publishes at once (two stores on one root, as two processes): every upload
    gets its own version, and the store read back from disk serves each as uploaded."""
    base = adapter_state(peft_stack(layers=2, width=16, rank=2))
    stores = [AdapterStore(tmp_path, signing_key=KEY), AdapterStore(tmp_path, signing_key=KEY)]
    uploads: dict[int, str] = {}
    lock = threading.Lock()
    for round_ in range(30):
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def publish(
            i: int, round_: int = round_, barrier: threading.Barrier = barrier, errors: list[BaseException] = errors
        ) -> None:
            blob = file_of(changed(base, [0, 1], seed=1000 * round_ + i))
            barrier.wait()
            try:
                manifest = stores[i].publish("a", blob)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return
            with lock:
                assert manifest.version not in uploads, f"round {round_}: v{manifest.version} given twice"
                uploads[manifest.version] = manifest.content_digest

        threads = [threading.Thread(target=publish, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
    assert sorted(uploads) == list(range(60))
    again = AdapterStore(tmp_path)
    assert {v: again.manifest("a", v).content_digest for v in range(60)} == uploads
    assert not again.skipped


def test_a_fifo_in_the_store_is_skipped_not_read(tmp_path: Path) -> None:
    store = AdapterStore(tmp_path, signing_key=KEY)
    store.publish("a", file_of(adapter_state(peft_stack())))
    os.mkfifo(tmp_path / "a" / "v1.safetensors")  # reading it would block for ever: no writer
    found: list[AdapterStore] = []
    # In a daemon thread so that a reader that blocks fails this test instead of hanging the run.
    reader = threading.Thread(target=lambda: found.append(AdapterStore(tmp_path)), daemon=True)
    reader.start()
    reader.join(timeout=300)
    assert found, "reading the store blocked on the FIFO"
    assert found[0].latest("a").version == 0
    assert "FIFO" in found[0].skipped["a/v1"]


def test_hostile_requests_get_4xx_never_a_500(tmp_path: Path) -> None:
    store = AdapterStore(tmp_path, signing_key=KEY)
    store.publish("a", file_of(adapter_state(peft_stack())))

    async def body() -> None:
        server = SyncServer(store)
        await server.start()
        transport = AiohttpTransport(server.url)
        try:
            for path, headers, status in [
                ("/v1/adapters/a/manifest", {"Range": "bytes=" + "9" * 5000 + "-"}, 416),
                ("/v1/adapters/a/manifest", {"Range": "bytes=0-" + "9" * 5000}, 416),
                ("/v1/adapters/a/manifest?version=" + "9" * 5000, {}, 404),
                ("/v1/adapters/a/delta?from=" + "9" * 5000, {}, 404),
                ("/v1/adapters/a/delta?from=0&to=-1", {}, 404),
            ]:
                assert (await transport.get(path, headers)).status == status, (path[:40], headers)
            signed = (await transport.get("/v1/adapters/a/manifest", {})).body
            assert verify_manifest(signed, KEY.public_key).version == 0  # served as the publisher signed it
        finally:
            await transport.close()
            await server.stop()

    _run(body)


def test_a_transfer_that_never_ends_is_cut_by_the_total_time_limit() -> None:
    async def body() -> None:
        async def stall(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse()
            await resp.prepare(request)
            await resp.write(b"{")
            await asyncio.Event().wait()  # never sends the rest
            return resp

        async with _Hostile({"/v1/adapters/a/manifest": stall}) as hostile:
            transport = AiohttpTransport(hostile.url, read_timeout_s=3600, timeout_s=3600)
            client = SyncClient(transport, transfer_timeout_s=0.5, **NO_WAIT)
            try:
                with pytest.raises(SyncError, match="not complete within"):
                    await client.pull("a", None)
            finally:
                await transport.close()

    _run(body)


def test_huge_shapes_deep_json_and_long_numbers_in_a_manifest_are_one_error() -> None:
    manifest = Manifest.from_bytes(_forged_v4(adapter_state(peft_stack()), KEY))
    doc = manifest.to_json()
    for field, value in [("shape", [2] * 200_000), ("shape", [2**40, 2]), ("rank", True), ("nbytes", -1)]:
        bad = json.loads(json.dumps(doc))
        bad["tensors"][0][field] = value
        bad.pop("digest")
        bad["digest"] = _doc_digest(bad)
        with pytest.raises(AdapterFormatError):
            Manifest.from_json(bad)
    for text in [b"[" * 100_000, b'{"version": ' + b"9" * 5000 + b"}"]:
        with pytest.raises(AdapterFormatError):
            Manifest.from_bytes(text)


def test_fuzz_campaign_bounded() -> None:
    """300 mutations of manifests, deltas, client responses and server requests: no traceback,
    no hang, nothing forged accepted, no half-applied adapter."""
    report = bench_fuzz_sync.run(300, seed=7, hang_s=60)
    assert report["tracebacks"] == 0, report["examples"]
    assert report["hangs"] == 0 and report["forged_accepted"] == 0, report
    assert sum(sum(c.values()) for c in report["by_target"].values()) == 300
