"""Published quantized checkpoints (issue 26): the config.json shipped in memwarden/models/configs
estimates the weights within 3% of the checkpoint's bytes as loaded (the Hub's safetensors file
sizes, recorded in each config's ``_memwarden_hub_safetensors_bytes``; a tied copy held once after
loading taken out). The weights come from the same meta model ``memwarden estimate`` runs."""

from __future__ import annotations

import json

import pytest

from memwarden.estimate.metamodel import model_for
from memwarden.estimate.resolve import CONFIG_DIR, resolve_model

PUBLISHED = sorted(p.stem for p in CONFIG_DIR.glob("*.json") if "_memwarden_hub_safetensors_bytes" in p.read_text())


def _weights_bytes(name: str) -> int:
    resolved = resolve_model(name)
    model = model_for(resolved, resolved.default_dtype, None)
    tensors = {id(t): t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]}
    return sum(tensors.values())


def test_published_checkpoints_are_shipped() -> None:
    assert len(PUBLISHED) >= 4
    assert {resolve_model(n).scheme.method for n in PUBLISHED} >= {"awq", "gptq"}  # type: ignore[union-attr]


@pytest.mark.parametrize("name", PUBLISHED)
def test_weights_within_3_percent_of_the_checkpoint(name: str) -> None:
    hub = json.loads((CONFIG_DIR / f"{name}.json").read_text())["_memwarden_hub_safetensors_bytes"]
    loaded = round(hub["total_gb"] * 1e9) - hub.get("held_once_bytes", 0)
    estimated = _weights_bytes(name)
    assert abs(estimated - loaded) <= 0.03 * loaded, (name, estimated, loaded)
