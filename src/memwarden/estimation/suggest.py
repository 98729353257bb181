"""Suggested changes priced by byte arithmetic on a card, and their ranking. Pure; no torch.

Suggestions are the cheapest changes that bring the peak under the device's usable bytes, each
with the peak it predicts and how that number was made:

- ``rerun``: the meta estimate was run again with the change (exact, like the estimate itself).
  The API does this for the largest image that fits (dynamic-resolution models).
- ``arithmetic``: byte arithmetic on this card's per-phase breakdown (an approximation; the
  formula is in each suggestion's ``note``):

  * weights int8 / int4: every nn.Linear weight shrinks to 1 byte (+ fp32 scale per row) or
    0.5625 bytes (NF4: 4 bits + one fp32 absmax per 64 weights) per parameter; the largest
    linear weight is dequantized to the compute dtype once per call while a prompt is
    prefilled (bitsandbytes' path above one token), so it is added back.
  * KV cache int8 / fp8: the KV bytes at each phase's peak shrink to 1 byte per element; one
    layer's keys and values are dequantized for attention, so one layer's share is added back.
  * visual-token pruning (FastV-style, in the language model): the KV cache and the language
    model's activations at the prefill and decode peaks shrink in proportion to the vision
    tokens removed; the encoder is unchanged.
  * layer offload: n decoder layers' weights live in host memory and are streamed in one at a
    time, so the device holds (n - 1) fewer layers.
"""

from __future__ import annotations

import math
from typing import Any

from memwarden.estimation.card import PARAM_BYTES, MemoryCard, ModelFacts, Request, Suggestion
from memwarden.units import format_bytes

__all__ = ["arithmetic_suggestions", "rank_suggestions"]

# Cost order of a change (least intrusive first): how suggestions that fit are ranked. Running in
# the checkpoint's own dtype changes nothing the model was trained or shipped with, so it comes first.
_COST = {"dtype": 0, "kv_dtype": 1, "weights_dtype": 2, "max_image": 3, "prune_visual_tokens": 4, "offload_layers": 5}


def _phase_peak(card: MemoryCard, adjust: Any) -> int:
    """Max over phases of ``adjust(phase, breakdown)`` (each phase's peak after a change)."""
    values = [int(adjust(name, info)) for name, info in card.phases.items()]
    return max(values) if values else card.peak_bytes


def arithmetic_suggestions(
    card: MemoryCard, facts: ModelFacts, usable_bytes: int, unified_memory: bool = False
) -> list[Suggestion]:
    """Changes whose peak is predicted by byte arithmetic on the card (see the module docstring)."""
    out: list[Suggestion] = []
    request = card.request or Request()
    elem = facts.dtype_bytes
    current_w = PARAM_BYTES.get(request.weights_dtype or "", elem)
    prefill_tokens = sum(card.tokens.values())
    for qdtype in ("int8", "int4"):
        q = PARAM_BYTES[qdtype]
        if q >= current_w:
            continue
        saved = int(facts.linear_weight_bytes * (1 - q / current_w))
        dequant = facts.largest_linear_bytes if prefill_tokens > 1 else 0

        def adjust(name: str, info: dict[str, Any], saved: int = saved, dequant: int = dequant) -> int:
            return info["peak_bytes"] - saved + (dequant if name in ("prefill", "encode") else 0)

        out.append(
            Suggestion.priced(
                "weights_dtype",
                f"{qdtype} weights (weight-only quantization of every linear layer)",
                {"weights_dtype": qdtype},
                _phase_peak(card, adjust),
                usable_bytes,
                "arithmetic",
                f"linear weights {format_bytes(facts.linear_weight_bytes)} -> x{q / current_w:.2f}; "
                f"+{format_bytes(dequant)} for one dequantized weight during prefill",
            )
        )
    kv_elem = PARAM_BYTES.get(request.kv_dtype or "", elem)
    if card.kv_cache_bytes and kv_elem > 1:
        layers = max(facts.decoder_layers, 1)

        def adjust_kv(name: str, info: dict[str, Any]) -> int:
            kv = int(info.get("by_category", {}).get("kv_cache", 0))
            return info["peak_bytes"] - int(kv * (1 - 1 / kv_elem)) + (kv // layers if kv else 0)

        out.append(
            Suggestion.priced(
                "kv_dtype",
                "int8 KV cache",
                {"kv_dtype": "int8"},
                _phase_peak(card, adjust_kv),
                usable_bytes,
                "arithmetic",
                f"KV bytes x{1 / kv_elem:.2f}; + one layer's keys and values dequantized for attention",
            )
        )
    vision = card.tokens.get("vision", 0)
    total = max(sum(card.tokens.values()) + request.new_tokens, 1)
    if vision:
        for ratio in (0.5, 0.75):
            share = ratio * vision / total

            def adjust_prune(name: str, info: dict[str, Any], share: float = share) -> int:
                if name not in ("prefill", "decode"):
                    return int(info["peak_bytes"])
                cats = info.get("by_category", {})
                seq_bytes = sum(int(cats.get(k, 0)) for k in ("kv_cache", "activation", "temporary"))
                return int(info["peak_bytes"] - share * seq_bytes)

            out.append(
                Suggestion.priced(
                    "prune_visual_tokens",
                    f"prune {ratio:.0%} of the {vision} visual tokens in the language model",
                    {"prune_visual_tokens": ratio},
                    _phase_peak(card, adjust_prune),
                    usable_bytes,
                    "arithmetic",
                    f"KV cache and activations x(1 - {share:.2f}) at the prefill and decode peaks",
                )
            )
    over = card.peak_bytes - usable_bytes
    if over > 0 and facts.decoder_layer_bytes > 0 and facts.decoder_layers > 1:
        n = min(facts.decoder_layers, math.ceil(over / facts.decoder_layer_bytes) + 1)
        saved = (n - 1) * facts.decoder_layer_bytes
        out.append(
            Suggestion.priced(
                "offload_layers",
                # On unified memory "host" is the same memory: the layers must come from disk instead.
                f"stream {n} of {facts.decoder_layers} decoder layers from disk (memory-mapped safetensors)"
                if unified_memory
                else f"offload {n} of {facts.decoder_layers} decoder layers to host memory",
                {"offload_layers": n},
                card.peak_bytes - saved,
                usable_bytes,
                "arithmetic",
                f"{n} x {format_bytes(facts.decoder_layer_bytes)} streamed one layer at a time",
            )
        )
    return out


def rank_suggestions(suggestions: list[Suggestion]) -> list[Suggestion]:
    """Changes that fit first, least intrusive first; then the rest by predicted peak."""
    return sorted(
        suggestions,
        key=lambda s: (not s.fits, _COST.get(s.kind, 9) if s.fits else 0, s.predicted_peak_bytes),
    )
