"""The adapter sync service over real HTTP on 127.0.0.1: only what differs travels, transfers
resume, every fault is caught before the model sees it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from _lora_models import adapter_state, changed, file_of, peft_stack
from memwarden.edge.sync.client import AiohttpTransport, SyncClient
from memwarden.edge.sync.errors import SyncError
from memwarden.edge.sync.faults import FaultPlan, FaultyTransport
from memwarden.edge.sync.server import SyncServer
from memwarden.edge.sync.signing import SigningKey
from memwarden.edge.sync.store import AdapterStore
from memwarden.runtime.lora.slot import AdapterSlot

KEY = SigningKey.generate()  # the publisher's; devices pin KEY.public_key
NO_WAIT = {"backoff_s": lambda attempt: 0.0, "publisher_key": KEY.public_key}


def _serve(tmp_path: Path, body: Callable[[SyncServer, AiohttpTransport], Awaitable[Any]]) -> Any:
    """Run ``body`` against a server on a port the OS picks, then shut both down."""

    async def main() -> Any:
        server = SyncServer(AdapterStore(tmp_path / "store", signing_key=KEY))
        await server.start()
        transport = AiohttpTransport(server.url)
        try:
            return await body(server, transport)
        finally:
            await transport.close()
            await server.stop()

    return asyncio.run(main())


def test_pull_fetches_only_the_changed_layers(tmp_path: Path) -> None:
    v0 = adapter_state(peft_stack(layers=8, width=1024, rank=8))
    v1 = changed(v0, [3, 5])

    async def body(server: SyncServer, transport: AiohttpTransport) -> None:
        server.store.publish("a", file_of(v0))
        client = SyncClient(transport, **NO_WAIT)
        first = await client.pull("a", None)
        assert first is not None and len(first.tensors) == 16
        full_bytes = server.bytes_sent
        server.store.publish("a", file_of(v1))
        sent_before = server.bytes_sent
        delta = await client.pull("a", first.manifest)
        assert delta is not None and sorted(delta.tensors) == [
            "layers.3.lora_A.weight",
            "layers.3.lora_B.weight",
            "layers.5.lora_A.weight",
            "layers.5.lora_B.weight",
        ]
        assert delta.base_digest == first.manifest.content_digest
        sent = server.bytes_sent - sent_before
        assert sent <= (2 / 8 + 0.01) * full_bytes, (sent, full_bytes)
        assert await client.pull("a", delta.manifest) is None  # up to date: the manifest only

    _serve(tmp_path, body)


def test_server_delta_resumes_with_ranges_and_applies(tmp_path: Path) -> None:
    model = peft_stack()
    v0 = adapter_state(model)
    slot = AdapterSlot(model, adapter="a")
    v1 = changed(v0, [1])

    async def body(server: SyncServer, transport: AiohttpTransport) -> None:
        server.store.publish("a", file_of(v0))
        server.store.publish("a", file_of(v1))
        faulty = FaultyTransport(transport, FaultPlan(drop=0.5, seed=3))
        client = SyncClient(faulty, **NO_WAIT)
        delta = await client.pull_delta("a", slot.manifest)
        slot.apply(delta)
        assert faulty.injected["drop"] >= 1 and client.stats.resumed >= 1

    _serve(tmp_path, body)
    assert torch.equal(
        model.base_model.model.layers[1].lora_A["default"].weight, v1["base_model.model.layers.1.lora_A.weight"]
    )


def test_server_restart_mid_transfer_is_survived(tmp_path: Path) -> None:
    v0 = adapter_state(peft_stack(width=256))

    async def body(server: SyncServer, transport: AiohttpTransport) -> None:
        server.store.publish("a", file_of(v0))
        restarts = 0

        async def restart() -> None:
            nonlocal restarts
            await server.stop()
            server.store = AdapterStore(server.store.root, signing_key=KEY)  # a new process reads the store back
            await server.start()
            restarts += 1

        faulty = FaultyTransport(transport, FaultPlan(restart=0.3, seed=1), restart=restart)
        client = SyncClient(faulty, **NO_WAIT)
        delta = await client.pull("a", None)
        assert delta is not None and restarts >= 1
        assert {n: t.data for n, t in delta.tensors.items()} == {
            k.removeprefix("base_model.model."): v.numpy().tobytes() for k, v in v0.items()
        }

    _serve(tmp_path, body)


def test_fault_campaign_never_serves_a_half_applied_adapter(tmp_path: Path) -> None:
    """>= 1,000 injected link faults over real HTTP: every pull either yields a fully verified
    delta that applies whole, or fails and leaves the model on the version it had."""
    model = peft_stack(layers=6, width=64, rank=4)
    state = adapter_state(model)
    slot = AdapterSlot(model, adapter="a")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    outputs = {slot.manifest.content_digest: model(x)}

    async def body(server: SyncServer, transport: AiohttpTransport) -> dict[str, int]:
        nonlocal state
        server.store.publish("a", file_of(state))
        restarts = 0

        async def restart() -> None:
            nonlocal restarts
            await server.stop()
            server.store = AdapterStore(server.store.root, signing_key=KEY)
            await server.start()
            restarts += 1

        faulty = FaultyTransport(
            transport,
            FaultPlan(truncate=0.13, corrupt=0.13, reorder=0.13, drop=0.13, restart=0.03, seed=11),
            restart=restart,
        )
        client = SyncClient(faulty, max_attempts=6, **NO_WAIT)
        failed = round_ = 0
        while faulty.total_injected < 1000:
            round_ += 1
            if round_ % 2 == 0:  # a new version on the server every other round
                state = changed(state, [round_ % 6, (round_ * 5) % 6], seed=round_)
                server.store.publish("a", file_of(state))
            before = slot.manifest
            try:
                delta = await client.pull("a", slot.manifest)
            except SyncError:
                failed += 1
                delta = None
            if delta is not None:
                slot.apply(delta)
                with torch.no_grad():
                    outputs[slot.manifest.content_digest] = model(x)
            held = slot.held_manifest()
            # The parameters hold exactly one version: the one before, or the new one in full.
            assert held.content_digest in (before.content_digest, slot.manifest.content_digest)
            assert held.content_digest == slot.manifest.content_digest
        # In the end, fault-free: the device converges on the server's latest version.
        faulty.plan = FaultPlan()
        delta = await client.pull("a", slot.manifest)
        if delta is not None:
            slot.apply(delta)
        assert slot.manifest.content_digest == server.store.latest("a").content_digest
        # Every injected fault was seen by the client (one detection per fault), none slipped through.
        assert client.stats.detected == faulty.total_injected, (client.stats, faulty.injected)
        return {"failed": failed, "restarts": restarts, "rounds": round_, **faulty.injected}

    counts = _serve(tmp_path, body)
    assert sum(v for k, v in counts.items() if k not in ("failed", "restarts", "rounds")) >= 1000
    assert counts["restarts"] >= 10 and counts["corrupt"] >= 100 and counts["truncate"] >= 100
    assert slot.held_manifest().content_digest == slot.manifest.content_digest
    # Every version served gave the output that version gives (nothing mixed).
    reference = peft_stack(layers=6, width=64, rank=4)
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(reference, state)
    assert torch.equal(model(x), reference(x))


def test_hostile_requests_are_refused(tmp_path: Path) -> None:
    async def body(server: SyncServer, transport: AiohttpTransport) -> None:
        server.store.publish("a", file_of(adapter_state(peft_stack())))
        for path, status in [
            ("/v1/adapters/..%2F..%2Fetc/manifest", 404),
            ("/v1/adapters/a/manifest?version=x", 404),
            ("/v1/tensors/notahexdigest", 400),
            ("/v1/tensors/" + "0" * 64, 404),
            ("/v1/adapters/a/delta?from=7", 404),
        ]:
            assert (await transport.get(path, {})).status == status, path
        resp = await transport.get("/v1/adapters/a/manifest", {"Range": "bytes=999999999-"})
        assert resp.status == 416
        listed = await transport.get("/v1/adapters", {})
        assert json.loads(listed.body) == {"adapters": ["a"]}

    _serve(tmp_path, body)
    with pytest.raises(ValueError):
        FaultPlan(corrupt=0.8, drop=0.5)
