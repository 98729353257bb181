"""Modality of a module from its path, by rules users can extend.

A path like ``model.visual.merger.mlp.0`` is read from its deepest component
up: the first component that names a rule decides (``merger`` -> fusion), so a
projector nested inside a vision tower is still fusion. The rules cover the
transformers VLM / audio-LM families (LLaVA, Qwen2-VL, PaliGemma, Idefics3,
SmolVLM, Gemma3, Qwen2-Audio, Mllama, InternVL, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from memwarden.trace.model import Modality

DEFAULT_RULES: dict[str, Modality] = {
    # fusion: projectors, mergers, connectors (checked before the towers that contain them)
    "multi_modal_projector": Modality.FUSION,
    "mm_projector": Modality.FUSION,
    "merger": Modality.FUSION,
    "connector": Modality.FUSION,
    "projector": Modality.FUSION,
    "audio_projector": Modality.FUSION,
    "embed_vision": Modality.FUSION,
    "embed_audio": Modality.FUSION,
    "vision_projection": Modality.FUSION,
    "mlp1": Modality.FUSION,  # InternVL's projector
    # vision towers
    "vision_tower": Modality.VISION,
    "visual": Modality.VISION,
    "vision_model": Modality.VISION,
    "vision_encoder": Modality.VISION,
    "image_encoder": Modality.VISION,
    "vision": Modality.VISION,
    "vit": Modality.VISION,
    "patch_embed": Modality.VISION,
    # audio towers
    "audio_tower": Modality.AUDIO,
    "audio_encoder": Modality.AUDIO,
    "audio_model": Modality.AUDIO,
    "audio": Modality.AUDIO,
    "speech_encoder": Modality.AUDIO,
    # language model
    "language_model": Modality.TEXT,
    "text_model": Modality.TEXT,
    "lm_head": Modality.TEXT,
    "embed_tokens": Modality.TEXT,
    "decoder": Modality.TEXT,
    "text_decoder": Modality.TEXT,
}

_SPLIT = re.compile(r"[.]")

# What a model call's argument carries, by the name transformers' processors give it: a root
# call's inputs take their modality from here (``pixel_values`` is vision even when numpy made it).
INPUT_RULES: dict[str, Modality] = {
    "input_ids": Modality.TEXT,
    "attention_mask": Modality.TEXT,
    "token_type_ids": Modality.TEXT,
    "position_ids": Modality.TEXT,
    "inputs_embeds": Modality.TEXT,
    "labels": Modality.TEXT,
    "decoder_input_ids": Modality.TEXT,
    "input_features": Modality.AUDIO,
    "input_values": Modality.AUDIO,
    "feature_attention_mask": Modality.AUDIO,
}
_INPUT_PREFIXES = (
    ("pixel", Modality.VISION),
    ("image", Modality.VISION),
    ("video", Modality.VISION),
    ("audio", Modality.AUDIO),
)


def input_modality(name: str) -> Modality:
    """The modality of a model argument by its name (``pixel_values_videos`` -> vision); shared
    for names that say nothing (a positional argument the signature does not name)."""
    found = INPUT_RULES.get(name)
    if found is not None:
        return found
    for prefix, modality in _INPUT_PREFIXES:
        if name.startswith(prefix):
            return modality
    return Modality.SHARED


@dataclass(frozen=True)
class ModalityRules:
    """Component name -> modality. ``extra`` rules win over the defaults."""

    extra: dict[str, Modality] = field(default_factory=dict)
    default: Modality = Modality.SHARED

    def lookup(self, component: str) -> Modality | None:
        if component in self.extra:
            return self.extra[component]
        return DEFAULT_RULES.get(component)

    def modality_of(self, path: str) -> Modality:
        if not path:
            return self.default
        for component in reversed(_SPLIT.split(path)):
            found = self.lookup(component)
            if found is not None:
                return found
        # A bare decoder stack (`model.layers.3` of a text-only model) is text.
        parts = path.split(".")
        if "layers" in parts or "norm" in parts[-1:]:
            return Modality.TEXT
        return self.default

    def with_rules(self, rules: dict[str, str | Modality]) -> ModalityRules:
        merged = dict(self.extra)
        for component, modality in rules.items():
            merged[component] = modality if isinstance(modality, Modality) else Modality[str(modality).upper()]
        return ModalityRules(extra=merged, default=self.default)
