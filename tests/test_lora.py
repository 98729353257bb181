"""LoRA adapter manifests, deltas and in-place hot swap (runtime/lora, edge/sync formats, CLI)."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from peft import set_peft_model_state_dict
from safetensors.torch import load_file

from _lora_models import adapter_state, changed, file_of, peft_stack
from memwarden.cli import main
from memwarden.edge.sync.delta import adapter_manifest, apply_to_adapter, make_delta, read_delta
from memwarden.edge.sync.manifest import AdapterFormatError, Manifest
from memwarden.runtime.lora.slot import AdapterSlot, AdapterSwapError
from memwarden.runtime.lora.versions import AdapterVersions

X = torch.randn(5, 32, generator=torch.Generator().manual_seed(7))


def _fresh_with(state: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = peft_stack()
    set_peft_model_state_dict(model, state)
    return model


def test_manifest_lists_every_tensor_with_rank_layer_and_digest() -> None:
    state = adapter_state(peft_stack())
    manifest, _ = adapter_manifest(file_of(state), adapter="a", version=3)
    assert len(manifest.tensors) == 8 and len(manifest.layers) == 4
    entry = manifest.by_name["layers.0.lora_A.weight"]
    assert (entry.shape, entry.dtype, entry.rank, entry.version, entry.layer) == ((4, 32), "F32", 4, 3, "layers.0")
    assert manifest.by_name["layers.0.lora_B.weight"].rank == 4
    again = Manifest.from_bytes(manifest.to_bytes())
    assert again == manifest
    doc = manifest.to_json()
    doc["tensors"][0]["digest"] = "0" * 64
    with pytest.raises(AdapterFormatError, match="digest"):
        Manifest.from_json(doc)


def test_delta_ships_only_changed_tensors_and_keeps_unchanged_versions() -> None:
    old_state = adapter_state(peft_stack())
    old, _ = adapter_manifest(file_of(old_state), adapter="a", version=0)
    blob, delta = make_delta(old, file_of(changed(old_state, [2])))
    assert sorted(delta.tensors) == ["layers.2.lora_A.weight", "layers.2.lora_B.weight"]
    assert delta.changed_layers == ["layers.2"]
    versions = {e.name: e.version for e in delta.manifest.tensors}
    assert versions["layers.2.lora_A.weight"] == 1 and versions["layers.0.lora_A.weight"] == 0
    assert read_delta(blob).manifest == delta.manifest


def test_applied_delta_is_bit_identical_to_loading_the_new_adapter() -> None:
    model = peft_stack()
    v0 = adapter_state(model)
    slot = AdapterSlot(model, adapter="a", version=0)
    v1 = changed(v0, [1, 3])
    blob, _ = make_delta(slot.manifest, file_of(v1))
    result = slot.apply(blob)
    assert (result.from_version, result.to_version, result.tensors_copied) == (0, 1, 4)
    assert torch.equal(model(X), _fresh_with(v1)(X))
    assert slot.held_manifest().content_digest == slot.manifest.content_digest
    slot.rollback()
    assert slot.version == 0 and torch.equal(model(X), _fresh_with(v0)(X))
    slot.activate(1)
    assert torch.equal(model(X), _fresh_with(v1)(X))


def test_a_failure_mid_copy_rolls_back_every_tensor() -> None:
    model = peft_stack()
    v0 = adapter_state(model)
    copies: list[str] = []

    def fail_third(name: str) -> None:
        copies.append(name)
        if len(copies) == 3:
            raise RuntimeError("device lost")

    slot = AdapterSlot(model, adapter="a", before_copy=fail_third)
    blob, _ = make_delta(slot.manifest, file_of(changed(v0, [0, 1, 2, 3])))
    before = model(X)
    with pytest.raises(AdapterSwapError, match="rolled back to v0"):
        slot.apply(blob)
    assert slot.version == 0 and torch.equal(model(X), before)
    assert slot.held_manifest().content_digest == slot.manifest.content_digest


def test_refuses_a_delta_for_another_base_a_corrupt_one_and_new_modules() -> None:
    model = peft_stack()
    v0 = adapter_state(model)
    slot = AdapterSlot(model, adapter="a")
    other, _ = adapter_manifest(file_of(changed(v0, [0], seed=5)), adapter="a", version=0)
    blob, _ = make_delta(other, file_of(changed(v0, [1])))
    with pytest.raises(AdapterSwapError, match="applies to v0"):
        slot.apply(blob)
    good, _ = make_delta(slot.manifest, file_of(changed(v0, [1])))
    damaged = bytearray(good)
    damaged[-3] ^= 0xFF
    with pytest.raises(AdapterFormatError, match="digest mismatch"):
        slot.apply(bytes(damaged))
    with pytest.raises(AdapterFormatError):
        slot.apply(good[: len(good) // 2])
    extra = {**v0, "base_model.model.layers.9.lora_A.weight": torch.zeros(4, 32)}
    blob, _ = make_delta(slot.manifest, file_of(extra))
    with pytest.raises(AdapterSwapError, match="no slot"):
        slot.apply(blob)
    assert slot.version == 0 and slot.refused == 4


def test_lower_rank_is_zero_padded_into_the_slot() -> None:
    model = peft_stack(rank=8)
    slot = AdapterSlot(model, adapter="a")
    small = adapter_state(peft_stack(rank=4, seed=3))
    reference = peft_stack(rank=4, seed=0)
    set_peft_model_state_dict(reference, small)
    # Same base weights (seed 0), the rank-4 adapter: identical outputs up to float summation order.
    slot.load(file_of(small))
    assert torch.allclose(model(X), reference(X), atol=1e-6)
    assert slot.manifest.by_name["layers.0.lora_A.weight"].rank == 4


def test_hot_swap_does_not_recompile_under_torch_compile() -> None:
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model = peft_stack()
    v0 = adapter_state(model)
    slot = AdapterSlot(model, adapter="a")
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    first = compiled(X)
    frames = counter.frame_count
    for i, layers in enumerate(([0], [1, 2], [3])):
        blob, _ = make_delta(slot.manifest, file_of(changed(v0, layers, seed=10 + i)))
        slot.apply(blob)
        out = compiled(X)
    assert counter.frame_count == frames, "a hot swap recompiled the graph"
    assert not torch.equal(out, first)
    assert torch.equal(out, model(X))
    torch._dynamo.reset()


def test_versions_lru_shares_tensors_and_keeps_the_active_version() -> None:
    model = peft_stack()
    v0 = adapter_state(model)
    per_version = sum(t.numel() * 4 for t in v0.values())
    layer = per_version // 4
    store = AdapterVersions(per_version + 2 * layer)
    slot = AdapterSlot(model, adapter="a", versions=store)
    state = v0
    for i in range(4):
        state = changed(state, [i], seed=20 + i)
        blob, _ = make_delta(slot.manifest, file_of(state))
        slot.apply(blob)
    assert store.nbytes <= store.budget_bytes
    assert slot.version in store and store.evictions >= 1
    assert store.versions[-1] == slot.version
    with pytest.raises(AdapterSwapError, match="not kept"):
        slot.activate(0)


def test_cli_diff_apply_manifest_round_trip(tmp_path, capsys) -> None:
    v0 = adapter_state(peft_stack())
    v1 = changed(v0, [2])
    (tmp_path / "v0.safetensors").write_bytes(file_of(v0))
    (tmp_path / "v1.safetensors").write_bytes(file_of(v1))
    d, out, m = tmp_path / "d.safetensors", tmp_path / "new.safetensors", tmp_path / "m.json"
    assert main(["lora", "diff", str(tmp_path / "v0.safetensors"), str(tmp_path / "v1.safetensors"), "-o", str(d)]) == 0
    assert "2 of 8 tensors changed in 1 of 4 layers" in capsys.readouterr().out
    assert main(["lora", "apply", str(tmp_path / "v0.safetensors"), str(d), "-o", str(out)]) == 0
    rebuilt = load_file(str(out))
    assert set(rebuilt) == set(v1) and all(torch.equal(rebuilt[k], v1[k]) for k in v1)
    assert main(["lora", "manifest", str(out), "-o", str(m)]) == 0
    doc = json.loads(m.read_text())
    assert doc["version"] == 1 and len(doc["tensors"]) == 8
    # A manifest is a valid OLD for diff (what a device reports it holds).
    assert main(["lora", "manifest", str(tmp_path / "v0.safetensors"), "-o", str(m)]) == 0
    assert main(["lora", "diff", str(m), str(tmp_path / "v1.safetensors"), "-o", str(d)]) == 0
    # A delta applied to the wrong base is one clear error.
    assert main(["lora", "apply", str(tmp_path / "v1.safetensors"), str(d), "-o", str(out)]) == 2
    assert "applies to content" in capsys.readouterr().err


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\x00" * 7,
        struct.pack("<Q", 1 << 40) + b"{}",
        struct.pack("<Q", 2) + b"[]",
        struct.pack("<Q", 8) + b"not json",
    ],
)
def test_hostile_adapter_files_are_one_clear_error(blob: bytes) -> None:
    with pytest.raises(AdapterFormatError):
        adapter_manifest(blob)


def test_hostile_offsets_are_refused() -> None:
    header = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    with pytest.raises(AdapterFormatError, match="beyond the end"):
        adapter_manifest(struct.pack("<Q", len(header)) + header + b"\x00" * 8)
    header = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    with pytest.raises(AdapterFormatError, match="bytes for shape"):
        adapter_manifest(struct.pack("<Q", len(header)) + header + b"\x00" * 8)
    with pytest.raises(AdapterFormatError, match="not a memwarden adapter delta"):
        apply_to_adapter(file_of(adapter_state(peft_stack())), file_of(adapter_state(peft_stack())))


def test_dora_and_embedding_adapters_swap_in_place() -> None:
    from peft import LoraConfig, get_peft_model
    from peft.utils import get_peft_model_state_dict

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(10, 8)
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(self.emb(x))

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        config = LoraConfig(r=2, target_modules=["emb", "lin"], use_dora=True, init_lora_weights=False)
        return get_peft_model(Net(), config)

    model = build()
    v0 = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    slot = AdapterSlot(model, adapter="d")
    assert {e.layer for e in slot.manifest.tensors} == {"emb", "lin"}
    v1 = {k: v * 1.5 for k, v in v0.items()}
    blob, _ = make_delta(slot.manifest, file_of(v1))
    slot.apply(blob)
    ids = torch.tensor([[1, 2, 3]])
    reference = build()
    set_peft_model_state_dict(reference, v1)
    assert torch.equal(model(ids), reference(ids))


def test_charged_budget_takes_kept_versions_out_of_the_budget() -> None:
    from memwarden.runtime.lora.versions import ChargedBudget

    store = AdapterVersions(1 << 20)
    slot = AdapterSlot(peft_stack(), adapter="a", versions=store)
    fixed = ChargedBudget("1MiB", store)
    assert fixed.budget_bytes == (1 << 20) - store.nbytes > 0

    class Telemetry:
        budget_bytes = 5000

    moving = ChargedBudget(Telemetry(), store)
    assert moving.budget_bytes == max(0, 5000 - store.nbytes)
    assert slot.version == 0


def test_a_transformers_adapter_with_rank_patterns_and_a_module_trained_in_full_hot_swaps() -> None:
    """A real transformers Llama under PEFT as users configure it: every Linear (`all-linear`),
    a lower rank for the MLPs (`rank_pattern`), and `lm_head` trained in full
    (`modules_to_save`, saved as `lm_head.weight`). A delta that changes one layer and the head
    applies in place and serves what loading the new adapter from scratch serves."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import LlamaConfig, LlamaForCausalLM

    def build(seed: int) -> torch.nn.Module:
        torch.manual_seed(0)
        config = LlamaConfig(
            num_hidden_layers=3,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
        )
        lora = LoraConfig(
            r=8, target_modules="all-linear", rank_pattern={"up_proj": 4, "down_proj": 4}, modules_to_save=["lm_head"]
        )
        model = get_peft_model(LlamaForCausalLM(config), lora).eval()
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name or "modules_to_save" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        return model

    served, fresh = build(1), build(2)
    old, new = get_peft_model_state_dict(served), get_peft_model_state_dict(fresh)
    update = {k: (new[k] if (".layers.1." in k or "lm_head" in k) else old[k].clone()) for k in old}
    set_peft_model_state_dict(fresh, update)
    slot = AdapterSlot(served, adapter="a", version=0)
    assert "lm_head.weight" in slot.params
    blob, delta = make_delta(slot.manifest, file_of(update))
    assert "lm_head" in delta.changed_layers and not any(".layers.0." in n for n in delta.tensors)
    slot.apply(blob)
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(served(ids).logits, fresh(ids).logits)
