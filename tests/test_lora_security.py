"""LoRA deltas from an attacker, and the CLI on PEFT folders: shapes other than the base's and
dtypes a model cannot hold are refused (never padded), versions never go backwards, signed deltas
are checked against the publisher's key, and `lora apply` on a PEFT folder writes a PEFT folder
that PEFT loads."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from peft.utils import get_peft_model_state_dict

from _lora_models import Stack, adapter_state, changed, file_of, peft_stack
from memwarden.cli import main
from memwarden.edge.sync.delta import adapter_manifest, make_delta
from memwarden.edge.sync.manifest import AdapterFormatError, RawTensor, read_safetensors, write_safetensors
from memwarden.runtime.lora.slot import AdapterSlot, AdapterSwapError

X = torch.randn(5, 32, generator=torch.Generator().manual_seed(7))


class Headed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(2))
        self.lm_head = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.lm_head(x)


def _headed() -> torch.nn.Module:
    """A PEFT model whose lm_head is trained in full (modules_to_save: saved as lm_head.weight)."""
    torch.manual_seed(0)
    config = LoraConfig(
        r=4, target_modules=["layers.0", "layers.1"], modules_to_save=["lm_head"], init_lora_weights=False
    )
    return get_peft_model(Headed(), config)


def test_a_full_weight_of_another_shape_is_refused_not_zero_padded() -> None:
    model = _headed()
    state = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    slot = AdapterSlot(model, adapter="a")
    head = next(k for k in state if k.endswith("lm_head.weight"))
    assert state[head].shape == (16, 32)
    before = model(X)
    for shape in [(16, 28), (12, 32)]:  # "a lower rank" of a weight that has none
        blob, delta = make_delta(slot.manifest, file_of({**state, head: torch.randn(shape)}))
        assert head.removeprefix("base_model.model.") in delta.tensors  # digests all match
        with pytest.raises(AdapterSwapError, match="only a LoRA A/B matrix may carry a lower rank"):
            slot.apply(blob)
    # A LoRA B whose output size differs (not its rank) is refused too.
    name = "base_model.model.layers.0.lora_B.weight"
    blob, _ = make_delta(slot.manifest, file_of({**state, name: torch.randn(24, 4)}))
    with pytest.raises(AdapterSwapError, match="does not fit"):
        slot.apply(blob)
    assert slot.version == 0 and torch.equal(model(X), before)
    assert slot.held_manifest().content_digest == slot.manifest.content_digest


def test_a_dtype_the_model_cannot_hold_is_one_error() -> None:
    model = peft_stack()
    slot = AdapterSlot(model, adapter="a")
    named, _ = read_safetensors(file_of(adapter_state(model)))
    name = "base_model.model.layers.0.lora_A.weight"
    t = named[name]
    for dtype in ("U16", "U32", "U64", "F16"):
        size = {"U16": 2, "U32": 4, "U64": 8, "F16": 2}[dtype]
        odd = {**named, name: RawTensor(dtype=dtype, shape=t.shape, data=b"\x01" * (size * 4 * 32))}
        blob, _ = make_delta(slot.manifest, write_safetensors(odd))
        with pytest.raises(AdapterSwapError, match=f"dtype {dtype}"):
            slot.apply(blob)
    assert slot.version == 0 and slot.refused == 4


def test_versions_never_go_backwards_in_the_slot_and_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    v0 = adapter_state(peft_stack())
    model = peft_stack()
    slot = AdapterSlot(model, adapter="a", version=5)
    with pytest.raises(AdapterSwapError, match="never go backwards"):
        slot.load(file_of(changed(v0, [0])), version=3)
    # A v5 adapter file whose content is v0's, and a delta from v0 to v1: applying it would be v5 -> v1.
    base_v0, _ = adapter_manifest(file_of(v0), adapter="a", version=0)
    delta, _ = make_delta(base_v0, file_of(changed(v0, [1])))
    named, meta = read_safetensors(file_of(v0))
    v5 = write_safetensors(named, {**meta, "memwarden_version": "5", "memwarden_adapter": "a"})
    (tmp_path / "v5.safetensors").write_bytes(v5)
    (tmp_path / "d.safetensors").write_bytes(delta)
    out = tmp_path / "out.safetensors"
    assert (
        main(["lora", "apply", str(tmp_path / "v5.safetensors"), str(tmp_path / "d.safetensors"), "-o", str(out)]) == 2
    )
    assert "never go backwards" in capsys.readouterr().err and not out.exists()


def test_cli_apply_on_a_peft_folder_writes_a_peft_folder_that_peft_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = peft_stack()
    model.save_pretrained(tmp_path / "base")
    v1 = changed(adapter_state(model), [2])
    (tmp_path / "v1.safetensors").write_bytes(file_of(v1))
    delta = tmp_path / "d.safetensors"
    assert main(["lora", "diff", str(tmp_path / "base"), str(tmp_path / "v1.safetensors"), "-o", str(delta)]) == 0
    capsys.readouterr()
    for out in ("new", "new2/"):
        target = tmp_path / out
        assert main(["lora", "apply", str(tmp_path / "base"), str(delta), "-o", str(target)]) == 0
        assert f"wrote {str(target).rstrip('/')}/ " in capsys.readouterr().out
        assert sorted(p.name for p in target.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
        torch.manual_seed(0)
        loaded = PeftModel.from_pretrained(Stack(4, 32), str(target))
        reference = peft_stack()
        set_peft_model_state_dict(reference, v1)
        with torch.no_grad():
            assert torch.equal(loaded(X), reference(X))
    # A file base with a trailing-slash output: a folder, not a file named "flat".
    (tmp_path / "v0.safetensors").write_bytes(file_of(adapter_state(model)))
    assert (
        main(["lora", "apply", str(tmp_path / "v0.safetensors"), str(delta), "-o", str(tmp_path / "flat") + "/"]) == 0
    )
    assert (tmp_path / "flat" / "adapter_model.safetensors").is_file()
    assert "wrote " + str(tmp_path / "flat") + "/" in capsys.readouterr().out


def test_cli_signed_deltas_are_checked_against_the_publisher_key(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    key, other = tmp_path / "pub.key", tmp_path / "other.key"
    assert main(["lora", "keygen", "-o", str(key)]) == 0
    assert main(["lora", "keygen", "-o", str(other)]) == 0
    assert (key.stat().st_mode & 0o777) == 0o600
    assert main(["lora", "keygen", "-o", str(key)]) == 2  # never overwritten
    capsys.readouterr()
    v0 = adapter_state(peft_stack())
    (tmp_path / "v0.safetensors").write_bytes(file_of(v0))
    (tmp_path / "v1.safetensors").write_bytes(file_of(changed(v0, [1])))
    files = [str(tmp_path / "v0.safetensors"), str(tmp_path / "v1.safetensors")]
    signed, unsigned = tmp_path / "signed.safetensors", tmp_path / "unsigned.safetensors"
    assert main(["lora", "diff", *files, "-o", str(signed), "--sign-key", str(key)]) == 0
    assert main(["lora", "diff", *files, "-o", str(unsigned)]) == 0
    pub = str(tmp_path / "pub.key.pub")
    out = str(tmp_path / "out.safetensors")
    capsys.readouterr()
    assert main(["lora", "apply", files[0], str(signed), "-o", out, "--publisher-key", pub]) == 0
    assert main(["lora", "apply", files[0], str(unsigned), "-o", out, "--publisher-key", pub]) == 2
    assert "not signed" in capsys.readouterr().err
    assert main(["lora", "apply", files[0], str(signed), "-o", out, "--publisher-key", str(other) + ".pub"]) == 2
    assert "not signed by the pinned publisher key" in capsys.readouterr().err


def test_hostile_safetensors_headers_are_one_error() -> None:
    import json

    for entry in [
        {"dtype": "F32", "shape": [2] * 200_000, "data_offsets": [0, 0]},
        {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]},
        {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]},
        {"dtype": "F32", "shape": [1], "data_offsets": [False, 4]},
    ]:
        header = json.dumps({"t": entry}).encode()
        with pytest.raises(AdapterFormatError):
            read_safetensors(struct.pack("<Q", len(header)) + header + b"\x00" * 4)
    deep = b"[" * 100_000
    with pytest.raises(AdapterFormatError, match="too deep"):
        read_safetensors(struct.pack("<Q", len(deep)) + deep)
