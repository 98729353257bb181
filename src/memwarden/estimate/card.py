"""MemoryCard: what an estimate says about one model, one request and (optionally) one device.

Pure: built from a meta-device Trace (``memwarden.capture.meta.capture``), the request, plain facts about
the model and a device profile; no torch. The API (``memwarden.estimate``) runs the capture and
hands the result here.

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
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from memwarden.analyze.timeline import breakdown_at, primary_device, summary
from memwarden.trace.model import Category, Phase, SpanKind, Trace, enum_name
from memwarden.trace.steps import steps_of
from memwarden.units import format_bytes

__all__ = [
    "DTYPE_BYTES",
    "PHASES",
    "CARD_KEYS",
    "Device",
    "MemoryCard",
    "ModelFacts",
    "Request",
    "Suggestion",
    "arithmetic_suggestions",
    "card_from_trace",
    "rank_suggestions",
    "verdicts_markdown",
]

PHASES = ("load", "encode", "prefill", "decode")
CARD_KEYS = (
    "peak_bytes",
    "weights_bytes",
    "kv_cache_bytes",
    "phases",
    "tokens",
    "usable_bytes",
    "fits",
    "headroom_bytes",
    "suggestions",
)

# Bytes per element (per parameter for quantized weights, scales included; see the module docstring).
DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8": 1,
    "int8": 1,
    "int4": 0.5625,
    "nf4": 0.5625,
}
# Cost order of a change (least intrusive first): how suggestions that fit are ranked.
_COST = {"kv_dtype": 0, "weights_dtype": 1, "max_image": 2, "prune_visual_tokens": 3, "offload_layers": 4}


class Device(Protocol):
    """What a card needs of a device profile (``memwarden.models.devices.DeviceProfile``)."""

    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def usable_bytes(self) -> int: ...


@dataclass(frozen=True, kw_only=True)
class Request:
    """One ``generate()`` call: media, text, output length, batch, dtypes."""

    images: tuple[tuple[int, int], ...] = ()  # (W, H) px, already resized for the model
    audio_seconds: float | None = None  # log-mel frames at 100 per second
    prompt_tokens: int = 128  # every text token, markers included; placeholders come on top
    new_tokens: int = 16  # decode steps of greedy generation
    batch: int = 1
    dtype: str = "float32"  # weights and activations
    weights_dtype: str | None = None  # quantized weight storage (int8, int4); None = dtype
    kv_dtype: str | None = None  # KV-cache storage; None = dtype

    def describe(self) -> str:
        parts = [f"{w}x{h} image" for w, h in self.images]
        if self.audio_seconds is not None:
            parts.append(f"{self.audio_seconds:g} s audio")
        parts.append(f"{self.prompt_tokens} prompt tokens")
        parts.append(f"{self.new_tokens} new tokens")
        if self.batch != 1:
            parts.append(f"batch {self.batch}")
        parts.append(self.dtype)
        if self.weights_dtype:
            parts.append(f"{self.weights_dtype} weights")
        if self.kv_dtype:
            parts.append(f"{self.kv_dtype} KV cache")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["images"] = [list(wh) for wh in self.images]
        return data


@dataclass(frozen=True, kw_only=True)
class ModelFacts:
    """Sizes of a model's parts that the arithmetic suggestions scale (measured on the meta model)."""

    name: str
    parameters: int
    linear_weight_bytes: int  # nn.Linear weights: what weight-only quantization converts
    largest_linear_bytes: int  # the one weight a quantized matmul dequantizes at a time
    decoder_layers: int  # language-model decoder layers
    decoder_layer_bytes: int  # weights of the largest one
    dtype_bytes: int  # bytes per element of weights and activations
    dynamic_resolution: bool = False  # accepts any image size that is a multiple of image_multiple_px
    image_multiple_px: int | None = None


@dataclass(frozen=True, kw_only=True)
class Suggestion:
    change: str  # what to do, in words
    setting: dict[str, Any]  # the estimate options that make the change (e.g. {"weights_dtype": "int4"})
    kind: str  # weights_dtype, kv_dtype, max_image, prune_visual_tokens, offload_layers
    predicted_peak_bytes: int
    fits: bool
    headroom_bytes: int
    method: str  # "rerun" (meta estimate run again with the change) or "arithmetic"
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MemoryCard:
    """Peak memory of one request, per phase, and the verdict for a device. ``to_json`` has exactly CARD_KEYS."""

    peak_bytes: int
    weights_bytes: int
    kv_cache_bytes: int  # live KV-cache bytes when generation ends
    phases: dict[str, dict[str, Any]]  # phase -> peak_bytes, by_category, by_modality (at that phase's peak)
    tokens: dict[str, int]  # per sequence: vision, audio and text tokens of the prompt
    usable_bytes: int | None = None
    fits: bool | None = None
    headroom_bytes: int | None = None
    suggestions: list[Suggestion] = field(default_factory=list)
    # not part of the JSON: what the card is about, for the Markdown card
    model: str = ""
    request: Request | None = None
    device: str | None = None  # the device's name
    device_id: str | None = None
    by_category_at_peak: dict[str, int] = field(default_factory=dict)
    by_modality_at_peak: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in CARD_KEYS}
        data["suggestions"] = [s.to_json() for s in self.suggestions]
        return data

    def verdict(self, usable_bytes: int) -> str:
        headroom = usable_bytes - self.peak_bytes
        if headroom < 0:
            return f"does not fit ({format_bytes(-headroom)} over)"
        return f"fits ({format_bytes(headroom)} headroom)"

    def to_text(self) -> str:
        """Plain lines for a terminal: peak, phases, verdict, changes."""
        lines = [f"{self.model or 'model'}: peak {format_bytes(self.peak_bytes)} (weights {format_bytes(self.weights_bytes)}, "
                 f"KV cache at the end {format_bytes(self.kv_cache_bytes)})"]  # fmt: skip
        if self.request is not None:
            lines.append(f"  request: {self.request.describe()}")
        tokens = ", ".join(f"{v} {k}" for k, v in self.tokens.items() if v)
        if tokens:
            lines.append(f"  tokens per sequence: {tokens}")
        for name, info in self.phases.items():
            lines.append(f"  {name:<8} {format_bytes(info['peak_bytes']):>12}")
        if self.usable_bytes is not None:
            lines.append(
                f"  {self.device}: usable {format_bytes(self.usable_bytes)}, {self.verdict(self.usable_bytes)}"
            )
        for s in self.suggestions:
            how = "re-run" if s.method == "rerun" else "arithmetic"
            mark = "fits" if s.fits else "does not fit"
            lines.append(f"  - {s.change}: {format_bytes(s.predicted_peak_bytes)}, {mark} ({how})")
        return "\n".join(lines)

    def to_markdown(self, devices: list[Device] | tuple[Device, ...] = ()) -> str:
        """A hardware-aware memory card: peak per phase, a verdict per device, the suggestions."""
        title = f"### Memory card: {self.model}" if self.model else "### Memory card"
        lines = [title, ""]
        if self.request is not None:
            lines += [f"Request: {self.request.describe()}.", ""]
        tokens = ", ".join(f"{v} {k}" for k, v in self.tokens.items() if v)
        if tokens:
            lines += [f"Tokens per sequence: {tokens}.", ""]
        lines += [
            "| phase | peak | above weights | KV cache at peak | largest category at peak |",
            "|---|---:|---:|---:|---|",
        ]
        for name in PHASES:
            info = self.phases.get(name)
            if not info:
                continue
            cats = dict(info.get("by_category", {}))
            kv = cats.get("kv_cache", 0)
            others = {k: v for k, v in cats.items() if k not in ("weight", "buffer")}
            top = max(others, key=lambda k: others[k]) if others else "-"
            lines.append(
                f"| {name} | {format_bytes(info['peak_bytes'])} | {format_bytes(info['peak_bytes'] - self.weights_bytes)} "
                f"| {format_bytes(kv)} | {top} |"
            )
        lines.append(f"| **peak** | **{format_bytes(self.peak_bytes)}** | | | |")
        lines += [
            "",
            f"Weights: {format_bytes(self.weights_bytes)}; KV cache at the end: {format_bytes(self.kv_cache_bytes)}.",
            "",
        ]
        rows = []
        seen = set()
        if self.device is not None and self.usable_bytes is not None:
            rows.append((self.device, self.usable_bytes))
            seen.add(self.device_id)
        for d in devices:
            if d.id not in seen:
                rows.append((d.name, d.usable_bytes))
                seen.add(d.id)
        if rows:
            lines += ["| device | usable memory | verdict |", "|---|---:|---|"]
            lines += [f"| {name} | {format_bytes(usable)} | {self.verdict(usable)} |" for name, usable in rows]
            lines.append("")
        if self.suggestions:
            lines += [
                f"Changes for {self.device}:" if self.device else "Changes:",
                "",
                "| change | predicted peak | fits | how |",
                "|---|---:|---|---|",
            ]
            for s in self.suggestions:
                how = "re-run estimate" if s.method == "rerun" else "byte arithmetic"
                lines.append(
                    f"| {s.change} | {format_bytes(s.predicted_peak_bytes)} | {'yes' if s.fits else 'no'} | {how} |"
                )
            lines.append("")
        return "\n".join(lines)


# -- building a card -----------------------------------------------------------------------


def _event_phases(trace: Trace) -> np.ndarray:
    """Phase of every event by when it happened: inside an encoder call -> encode, else the step
    (prefill/decode) it falls in or follows, else load. (The Trace's ``phase`` column is the phase
    of the block an event belongs to; a card wants the timeline cut into windows.)"""
    t = trace.events["time_us"]
    phases = np.full(len(t), int(Phase.LOAD), dtype=np.int64)
    kind, start, end = trace.spans["kind"], trace.spans["start_us"], trace.spans["end_us"]
    names = [trace.string(int(i)) for i in trace.spans["name"]]
    steps = sorted((int(start[i]), int(trace.spans["phase"][i])) for i in np.flatnonzero(kind == SpanKind.STEP))
    if steps:
        starts = np.array([s for s, _ in steps], dtype=np.int64)
        step_phase = np.array([p for _, p in steps], dtype=np.int64)
        k = np.searchsorted(starts, t, side="right") - 1
        phases = np.where(k >= 0, step_phase[np.clip(k, 0, None)], phases)
    for i in np.flatnonzero(kind == SpanKind.PHASE):
        if names[i] == "encode":
            phases[(t >= start[i]) & (t <= end[i])] = int(Phase.ENCODE)
    return phases


def _phase_breakdowns(trace: Trace, device: int) -> dict[str, dict[str, Any]]:
    n = trace.num_events
    if n == 0:
        return {}
    live = trace.live_bytes(device)
    on = trace.events["device"] == device
    phases = _event_phases(trace)
    out: dict[str, dict[str, Any]] = {}
    for p in Phase:
        sel = np.flatnonzero(on & (phases == p))
        if len(sel) == 0:
            continue
        index = int(sel[np.argmax(live[sel])])
        out[enum_name(p)] = {
            "peak_bytes": int(live[index]),
            "by_category": breakdown_at(trace, index, "category", device),
            "by_modality": breakdown_at(trace, index, "modality", device),
        }
    return {k: out[k] for k in (*PHASES, *(k for k in out if k not in PHASES)) if k in out}


def _kv_at_end(trace: Trace, device: int) -> int:
    """KV-cache bytes when the last step ends (generate drops the cache when it returns)."""
    if trace.num_events == 0:
        return 0
    kv = np.where(trace.events["category"] == Category.KV_CACHE, trace.signed_bytes(device), 0)
    live_kv = np.cumsum(kv)
    steps = steps_of(trace)
    if not steps:
        return int(live_kv[-1])
    last = int(np.searchsorted(trace.events["time_us"], steps[-1].end_us, side="right")) - 1
    return int(live_kv[last]) if last >= 0 else 0


def _tokens(trace: Trace) -> dict[str, int]:
    for step in steps_of(trace):
        if step.phase == "prefill" and step.tokens:
            t = step.tokens
            return {"vision": t.get("vision", 0), "audio": t.get("audio", 0), "text": t.get("text", 0)}
    return {"vision": 0, "audio": 0, "text": 0}


def card_from_trace(
    trace: Trace,
    *,
    model: str = "",
    request: Request | None = None,
    facts: ModelFacts | None = None,
    device: Device | None = None,
) -> MemoryCard:
    """The card of a meta trace; with a device, its verdict and arithmetic suggestions (ranked)."""
    s = summary(trace, top=0)
    dev = primary_device(trace)
    card = MemoryCard(
        peak_bytes=s.peak_bytes,
        weights_bytes=s.weights_bytes,
        kv_cache_bytes=_kv_at_end(trace, dev),
        phases=_phase_breakdowns(trace, dev),
        tokens=_tokens(trace),
        model=model,
        request=request,
        by_category_at_peak=dict(s.by_category_at_peak),
        by_modality_at_peak=dict(s.by_modality_at_peak),
    )
    if device is not None:
        apply_device(card, device)
        if facts is not None and not card.fits:
            card.suggestions = rank_suggestions(
                arithmetic_suggestions(card, facts, device.usable_bytes, bool(getattr(device, "unified_memory", False)))
            )
    return card


def apply_device(card: MemoryCard, device: Device) -> None:
    card.device = device.name
    card.device_id = device.id
    card.usable_bytes = int(device.usable_bytes)
    card.headroom_bytes = card.usable_bytes - card.peak_bytes
    card.fits = card.headroom_bytes >= 0


def _suggestion(
    kind: str, change: str, setting: dict[str, Any], peak: int, usable: int, method: str, note: str
) -> Suggestion:
    peak = int(max(peak, 0))
    return Suggestion(
        change=change,
        setting=setting,
        kind=kind,
        predicted_peak_bytes=peak,
        fits=peak <= usable,
        headroom_bytes=usable - peak,
        method=method,
        note=note,
    )


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
    current_w = DTYPE_BYTES.get(request.weights_dtype or "", elem)
    prefill_tokens = sum(card.tokens.values())
    for qdtype in ("int8", "int4"):
        q = DTYPE_BYTES[qdtype]
        if q >= current_w:
            continue
        saved = int(facts.linear_weight_bytes * (1 - q / current_w))
        dequant = facts.largest_linear_bytes if prefill_tokens > 1 else 0

        def adjust(name: str, info: dict[str, Any], saved: int = saved, dequant: int = dequant) -> int:
            return info["peak_bytes"] - saved + (dequant if name in ("prefill", "encode") else 0)

        out.append(
            _suggestion(
                "weights_dtype", f"{qdtype} weights (weight-only quantization of every linear layer)",
                {"weights_dtype": qdtype}, _phase_peak(card, adjust), usable_bytes, "arithmetic",
                f"linear weights {format_bytes(facts.linear_weight_bytes)} -> x{q / current_w:.2f}; "
                f"+{format_bytes(dequant)} for one dequantized weight during prefill",
            )
        )  # fmt: skip
    kv_elem = DTYPE_BYTES.get(request.kv_dtype or "", elem)
    if card.kv_cache_bytes and kv_elem > 1:
        layers = max(facts.decoder_layers, 1)

        def adjust_kv(name: str, info: dict[str, Any]) -> int:
            kv = int(info.get("by_category", {}).get("kv_cache", 0))
            return info["peak_bytes"] - int(kv * (1 - 1 / kv_elem)) + (kv // layers if kv else 0)

        out.append(
            _suggestion(
                "kv_dtype", "int8 KV cache", {"kv_dtype": "int8"}, _phase_peak(card, adjust_kv), usable_bytes,
                "arithmetic", f"KV bytes x{1 / kv_elem:.2f}; + one layer's keys and values dequantized for attention",
            )
        )  # fmt: skip
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
                _suggestion(
                    "prune_visual_tokens", f"prune {ratio:.0%} of the {vision} visual tokens in the language model",
                    {"prune_visual_tokens": ratio}, _phase_peak(card, adjust_prune), usable_bytes, "arithmetic",
                    f"KV cache and activations x(1 - {share:.2f}) at the prefill and decode peaks",
                )
            )  # fmt: skip
    over = card.peak_bytes - usable_bytes
    if over > 0 and facts.decoder_layer_bytes > 0 and facts.decoder_layers > 1:
        n = min(facts.decoder_layers, math.ceil(over / facts.decoder_layer_bytes) + 1)
        saved = (n - 1) * facts.decoder_layer_bytes
        out.append(
            _suggestion(
                "offload_layers",
                # On unified memory "host" is the same memory: the layers must come from disk instead.
                f"stream {n} of {facts.decoder_layers} decoder layers from disk (memory-mapped safetensors)"
                if unified_memory else f"offload {n} of {facts.decoder_layers} decoder layers to host memory",
                {"offload_layers": n}, card.peak_bytes - saved, usable_bytes, "arithmetic",
                f"{n} x {format_bytes(facts.decoder_layer_bytes)} streamed one layer at a time",
            )
        )  # fmt: skip
    return out


def rank_suggestions(suggestions: list[Suggestion]) -> list[Suggestion]:
    """Changes that fit first, least intrusive first; then the rest by predicted peak."""
    return sorted(
        suggestions,
        key=lambda s: (not s.fits, _COST.get(s.kind, 9) if s.fits else 0, s.predicted_peak_bytes),
    )


def verdicts_markdown(cards: list[MemoryCard], devices: list[Device]) -> str:
    """One row per card (a request), one column per device: where a model stops fitting."""
    head = "| request | peak | " + " | ".join(d.name for d in devices) + " |"
    rule = "|---|---:|" + "---|" * len(devices)
    rows = [head, rule]
    for card in cards:
        req = card.request.describe() if card.request else card.model
        cells = ["fits" if card.peak_bytes <= d.usable_bytes else "no" for d in devices]
        rows.append(f"| {req} | {format_bytes(card.peak_bytes)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
