"""The tiered feature cache as the session's encoder cache: keys carry the encoder's contract, so a
swapped encoder or adapter never gets an old entry; prewarmed requests skip the encoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.utils import get_peft_model_state_dict
from safetensors.torch import save

from memwarden.edge.sync.delta import make_delta
from memwarden.models import zoo
from memwarden.runtime.featcache import FeatureCache
from memwarden.runtime.featcache_contract import TieredEncoderStore
from memwarden.runtime.lora.slot import AdapterSlot
from memwarden.runtime.lora.versions import ChargedBudget
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.session_config import SessionConfig
from memwarden.runtime.session_hooks import SessionHooks

NEW = 4
GK = zoo.generate_kwargs("llava")


@pytest.fixture(scope="module")
def llava() -> torch.nn.Module:
    return zoo.build_model("llava", "tiny")


class Calls:
    """Counts real encoder runs: a hook on the encoder's first submodule, which a cache hit skips."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.n = 0
        tower = model.model.vision_tower
        first = next(iter(tower.children()))
        self.handle = first.register_forward_hook(lambda *a: self._hit())

    def _hit(self) -> None:
        self.n += 1


def _serve(model: torch.nn.Module, store: TieredEncoderStore, inputs: dict[str, Any]) -> torch.Tensor:
    with torch.inference_mode():
        session = GovernedSession(
            model, budget="1GiB", config=SessionConfig(prefix_reuse=False), hooks=SessionHooks(encoder_store=store)
        )
        try:
            return session.generate(**inputs, max_new_tokens=NEW, **GK)
        finally:
            session.close()


def _reference(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    with torch.inference_mode():
        return model.generate(**inputs, max_new_tokens=NEW, **GK)


def test_swapped_encoder_weights_never_hit_old_entries(llava: torch.nn.Module, tmp_path: Path) -> None:
    model = llava
    calls = Calls(model)
    store = TieredEncoderStore(FeatureCache(tmp_path / "l2"), model)
    inputs = zoo.make_inputs(model, prompt_tokens=30, seed=0)
    first = _serve(model, store, inputs)
    _serve(model, store, inputs)
    assert calls.n == 1 and store.stats()["l1"]["hits"] == 1
    weight = model.model.vision_tower.encoder.layers[0].mlp.fc1.weight
    saved = weight.detach().clone()
    try:
        for write in ("copy_", ".data"):
            with torch.no_grad():
                if write == "copy_":
                    weight.copy_(saved * 1.5)
                else:
                    weight.data.copy_(saved * 0.5)  # bypasses the version counter: the sampled values see it
            before = calls.n
            out = _serve(model, store, inputs)
            assert calls.n == before + 1, f"a stale hit after a {write} write"
            assert torch.equal(out, _reference(model, inputs))
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    out = _serve(model, store, inputs)  # the original weights again: their entries are still there
    assert torch.equal(out, first) and store.stats()["contract_changes"] == 3
    calls.handle.remove()


def test_adapter_swap_on_the_encoder_misses_and_serves_fresh_features(tmp_path: Path) -> None:
    base = zoo.build_model("llava", "tiny")
    targets = r".*vision_tower.*\.(q_proj|v_proj)"
    model = get_peft_model(base, LoraConfig(r=4, target_modules=targets, init_lora_weights=False))
    slot = AdapterSlot(model, adapter="vision")
    store = TieredEncoderStore(FeatureCache(tmp_path / "l2"), base, adapters=[slot])
    calls = Calls(base)
    inputs = zoo.make_inputs(base, prompt_tokens=30, seed=1)
    _serve(base, store, inputs)
    state = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    new = {k: v + 0.25 for k, v in state.items()}
    blob, _ = make_delta(slot.manifest, save(new))
    slot.apply(blob)
    out = _serve(base, store, inputs)
    assert calls.n == 2, "the old adapter's features were served"
    assert torch.equal(out, _reference(base, inputs))  # (runs the encoder once more, uncached)
    slot.rollback()
    _serve(base, store, inputs)
    assert calls.n == 3  # back on v0: v0's features are valid again, and cached
    assert store.stats()["l1"]["hits"] == 1
    calls.handle.remove()
    # The kept adapter versions come out of the session's budget.
    kept = slot.versions.nbytes
    assert kept > 0 and slot.versions.versions == [1, 0]
    with torch.inference_mode():
        session = GovernedSession(
            base, budget=ChargedBudget("1GiB", slot.versions), config=SessionConfig(prefix_reuse=False)
        )
        assert session.memory.budget_bytes == 2**30 - kept
        session.close()


def test_prewarmed_requests_skip_the_encoder(llava: torch.nn.Module, tmp_path: Path) -> None:
    model = llava
    calls = Calls(model)
    images = [zoo.make_inputs(model, prompt_tokens=30, seed=s) for s in range(3)]
    cloud = TieredEncoderStore(FeatureCache(tmp_path / "l2"), model)
    expected = [_serve(model, cloud, x) for x in images]
    assert calls.n == 3
    manifest = cloud.manifest()
    assert len(manifest["media"]) == 3
    # A fresh process on the device: empty L1, the disk tier from before, prewarmed from the manifest.
    device = TieredEncoderStore(FeatureCache(tmp_path / "l2"), model)
    assert device.prewarm(manifest) == 3
    got = [_serve(model, device, x) for x in images]
    assert calls.n == 3, "a prewarmed request ran the encoder"
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    stats = device.stats()
    assert (stats["l1"]["hits"], stats["l2"]["hits"], stats["prewarmed"]) == (3, 0, 3)
    assert {"expirations", "evictions"} <= set(stats["l1"]) and {"expirations", "evictions"} <= set(stats["l2"])
    # A manifest made under another contract (another processor) loads nothing.
    other = TieredEncoderStore(FeatureCache(tmp_path / "l2"), model, processor=_Processor(448))
    assert other.prewarm(manifest) == 0
    calls.handle.remove()


class _Processor:
    def __init__(self, size: int) -> None:
        self.image_processor = _ImageProcessor(size)


class _ImageProcessor:
    def __init__(self, size: int) -> None:
        self.size = size

    def to_dict(self) -> dict[str, Any]:
        return {"size": {"height": self.size, "width": self.size}, "do_normalize": True, "image_mean": [0.5] * 3}


def test_contract_covers_preprocessing_dtype_and_size_policy(llava: torch.nn.Module) -> None:
    cache = FeatureCache()
    a = TieredEncoderStore(cache, llava, processor=_Processor(336))
    b = TieredEncoderStore(cache, llava, processor=_Processor(448))
    assert a.contract["image_size_policy"] == {"image_processor.size": {"height": 336, "width": 336}}
    assert a.contract["dtype"] == ["torch.float32"]
    assert a.key("m") != b.key("m")
    a.put("m", torch.ones(2))
    assert b.get("m") is None and torch.equal(a.get("m"), torch.ones(2))
    a.clear()  # memory pressure: L1 only
    assert a.nbytes == 0 and cache.stats().l2.entries == 0  # (no L2 configured here)


def test_outputs_round_trip_through_the_disk_tier(llava: torch.nn.Module, tmp_path: Path) -> None:
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    store = TieredEncoderStore(FeatureCache(tmp_path), llava)
    value = BaseModelOutputWithPooling(
        last_hidden_state=torch.ones(1, 2, 3), hidden_states=(torch.zeros(1), torch.ones(2))
    )
    store.put("k", value)
    store.clear()  # L1 gone: the next get reads the safetensors file
    got = store.get("k")
    assert isinstance(got, BaseModelOutputWithPooling)
    assert torch.equal(got.last_hidden_state, value.last_hidden_state) and len(got.hidden_states) == 2
    store.put("odd", object())  # not tensors: never cached
    assert store.stats()["unstorable"] == 1


def test_the_session_default_encoder_cache_is_contract_keyed(llava: torch.nn.Module) -> None:
    """No ``encoder_cache=`` given: the session caches encoder outputs in the contract-keyed tiered
    store, so new encoder weights mean a miss and fresh features, within one session."""
    model = llava
    calls = Calls(model)
    inputs = zoo.make_inputs(model, prompt_tokens=30, seed=3)
    weight = model.model.vision_tower.encoder.layers[0].mlp.fc1.weight
    saved = weight.detach().clone()
    try:
        with torch.inference_mode():
            session = GovernedSession(model, budget="1GiB", config=SessionConfig(prefix_reuse=False))
            assert isinstance(session.encoder_cache.store, TieredEncoderStore)
            session.generate(**inputs, max_new_tokens=NEW, **GK)
            session.generate(**inputs, max_new_tokens=NEW, **GK)
            assert calls.n == 1 and session.stats()["encoder_hits"] == 1
            weight.copy_(saved * 1.5)  # a new encoder
            swapped = session.generate(**inputs, max_new_tokens=NEW, **GK)
            session.close()
        assert calls.n == 2  # the old features were not served
        assert torch.equal(swapped, _reference(model, inputs))
    finally:
        with torch.no_grad():
            weight.copy_(saved)
        calls.handle.remove()
