"""Published quantized checkpoints (issue 26): the config.json shipped in memwarden/models/configs
estimates the weights within 3% of the checkpoint's bytes as loaded (the Hub's safetensors file
sizes, recorded in each config's ``_memwarden_hub_safetensors_bytes``; a tied copy held once after
loading taken out). The weights come from the same meta model ``memwarden estimate`` runs."""

from __future__ import annotations

import json

import pytest

from memwarden.estimation.metamodel import layout_for, model_for
from memwarden.estimation.resolve import CONFIG_DIR, resolve_model

PUBLISHED = sorted(p.stem for p in CONFIG_DIR.glob("*.json") if "_memwarden_hub_safetensors_bytes" in p.read_text())


def _weights_bytes(name: str) -> int:
    resolved = resolve_model(name)
    model = model_for(resolved, resolved.default_dtype, None)
    tensors = {id(t): t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]}
    return sum(tensors.values())


def test_published_checkpoints_are_shipped() -> None:
    assert len(PUBLISHED) >= 6
    methods = {resolve_model(n).scheme.method for n in PUBLISHED}  # type: ignore[union-attr]
    assert methods >= {"awq", "gptq", "bitsandbytes-4bit", "compressed-tensors"}


def _stored(name: str) -> tuple[dict[str, int], object]:
    """(bytes per tensor dtype of the meta model as the checkpoint stores it, its layout)."""
    resolved = resolve_model(name)
    model = model_for(resolved, resolved.default_dtype, None)
    by_dtype: dict[str, int] = {}
    seen: set[int] = set()
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            key = str(t.dtype).removeprefix("torch.")
            by_dtype[key] = by_dtype.get(key, 0) + t.numel() * t.element_size()
    return by_dtype, layout_for(model)


def test_nf4_checkpoint_quantizes_the_vision_tower_and_keeps_the_tied_head() -> None:
    """unsloth's plain bnb-4bit upload lists no llm_int8_skip_modules: transformers' defaults keep
    only the (tied) output head, so the ViT's Linears are NF4 as well."""
    by_dtype, layout = _stored("qwen2-vl-2b-instruct-bnb-4bit")
    kept = [p for paths in layout.kept.values() for p in paths]  # type: ignore[attr-defined]
    assert kept == ["lm_head"]
    assert layout.converted == 28 * 7 + 32 * 4 + 2  # type: ignore[attr-defined]  # decoder, ViT blocks, merger
    assert by_dtype["uint8"] > 0.6e9  # packed NF4 weights and double-quantized absmax


def test_fp8_checkpoint_keeps_the_ignored_vision_tower_in_bf16() -> None:
    """The compressed-tensors ``ignore`` list names checkpoint keys (``visual.blocks.0.attn.qkv``),
    not transformers 5 module paths (``model.visual.blocks.0.attn.qkv``): both must match."""
    by_dtype, layout = _stored("qwen2.5-vl-7b-instruct-fp8-dynamic")
    assert layout.converted == 28 * 7  # type: ignore[attr-defined]  # the decoder's Linears only
    assert sum(len(p) for p in layout.kept.values()) == 32 * 5 + 2 + 1  # type: ignore[attr-defined]
    assert 6.4e9 < by_dtype["float8_e4m3fn"] < 6.6e9


@pytest.mark.parametrize("name", PUBLISHED)
def test_weights_within_3_percent_of_the_checkpoint(name: str) -> None:
    hub = json.loads((CONFIG_DIR / f"{name}.json").read_text())["_memwarden_hub_safetensors_bytes"]
    loaded = round(hub["total_gb"] * 1e9) - hub.get("held_once_bytes", 0)
    estimated = _weights_bytes(name)
    assert abs(estimated - loaded) <= 0.03 * loaded, (name, estimated, loaded)
