"""MemoryCard: what an estimate says about one model, one request and (optionally) one device.

Plain data and its renderings (text, Markdown, JSON); no torch. The card is built from a
meta-device Trace by :mod:`memwarden.estimation.build`; the changes it suggests are priced by
:mod:`memwarden.estimation.suggest` (byte arithmetic) and :mod:`memwarden.estimation.rerun` (re-runs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from memwarden.units import DTYPE_BYTES, format_bytes

__all__ = [
    "PARAM_BYTES",
    "PHASES",
    "CARD_KEYS",
    "Device",
    "MemoryCard",
    "ModelFacts",
    "Request",
    "Suggestion",
    "fit_lines",
    "verdicts_markdown",
]

PHASES = ("load", "input", "encode", "prefill", "decode")
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
    "generation",
    "logits",
    "versions",
    "quantization",
    "limit",
    "fit",
    "runtime",
    "processor",
)

# Bytes a parameter takes stored as each dtype a request names (``dtype``, ``weights_dtype``,
# ``kv_dtype``): an element's bytes (the one table, ``memwarden.units.DTYPE_BYTES``), except that
# 4-bit weights are packed two to a byte with one fp32 absmax per 64 weights (NF4's layout, see
# memwarden.estimation.suggest), where units counts a byte per 4-bit element as ONNX Runtime stores it.
PARAM_BYTES: dict[str, float] = {
    **{name: DTYPE_BYTES[name] for name in ("float32", "float16", "bfloat16", "int8")},
    "float8": DTYPE_BYTES["float8_e4m3fn"],  # either float8 layout: one byte
    "int4": 0.5 + DTYPE_BYTES["float32"] / 64,  # 0.5625
    "nf4": 0.5 + DTYPE_BYTES["float32"] / 64,
}


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
    videos: tuple[tuple[int, int, int], ...] = ()  # (W, H, frames): frames of W x H px each
    audio_seconds: float | None = None  # log-mel frames at 100 per second
    prompt_tokens: int = 128  # every text token, markers included; placeholders come on top
    new_tokens: int = 16  # decode steps of greedy generation
    batch: int = 1
    dtype: str = "float32"  # weights and activations
    weights_dtype: str | None = None  # quantized weight storage (int8, int4); None = dtype
    kv_dtype: str | None = None  # KV-cache storage; None = dtype
    max_pixels: int | None = None  # a dynamic-resolution processor's pixel limit (Qwen2-VL's max_pixels)
    # "last": the prefill computes the last position's logits (transformers >= 4.45's generate);
    # "full": every prompt position's, upcast to float32, as older transformers and many published tables
    logits: str = "last"

    def describe(self) -> str:
        parts = [f"{w}x{h} image" for w, h in self.images] + [f"{w}x{h}x{f} video" for w, h, f in self.videos]
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
        if self.max_pixels is not None:
            parts.append(f"max {self.max_pixels} pixels per image")
        if self.logits == "full":
            parts.append("full-prompt logits")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["images"] = [list(wh) for wh in self.images]
        data["videos"] = [list(whf) for whf in self.videos]
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
    kind: str  # dtype, weights_dtype, kv_dtype, max_image, prune_visual_tokens, offload_layers
    predicted_peak_bytes: int
    fits: bool
    headroom_bytes: int
    method: str  # "rerun" (meta estimate run again with the change) or "arithmetic"
    note: str = ""

    @classmethod
    def priced(
        cls, kind: str, change: str, setting: dict[str, object], peak: int, usable: int, method: str, note: str
    ) -> Suggestion:
        """The change ``setting`` predicted to peak at ``peak`` bytes (an arithmetic estimate below
        zero counts as zero), judged against ``usable`` bytes: whether it fits and the headroom follow."""
        peak = int(max(peak, 0))
        return cls(
            change=change,
            setting=setting,
            kind=kind,
            predicted_peak_bytes=peak,
            fits=peak <= usable,
            headroom_bytes=usable - peak,
            method=method,
            note=note,
        )

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
    # new_tokens, steps_run (steps the meta run made) and whether the rest were extrapolated
    generation: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)  # transformers and torch whose code ran
    # how the weights are stored: method, what stayed unquantized and why, the method's transients; None: dense
    quantization: dict[str, Any] | None = None
    # the limit the verdict compares with: {"kind", "bytes", "source"} (an OS's per-app kill limit, a GPU share)
    limit: dict[str, Any] | None = None
    # --fit: {solve, value, peak_bytes, budget_bytes, next_value, next_peak_bytes, settings}
    fit: dict[str, Any] | None = None
    # on a CUDA device: workspaces, the caching allocator's reserve, the context (estimate/cuda_runtime.py)
    runtime: dict[str, Any] | None = None
    # where the image processor's settings came from, for a request with images or videos:
    # "checkpoint" (the folder's preprocessor_config.json) or "defaults" (the class's, sized by the config)
    processor: str | None = None
    # not part of the JSON: what the card is about, for the Markdown card
    model: str = ""
    request: Request | None = None
    device: str | None = None  # the device's name
    device_id: str | None = None
    by_category_at_peak: dict[str, int] = field(default_factory=dict)
    by_modality_at_peak: dict[str, int] = field(default_factory=dict)

    @property
    def logits(self) -> str:
        return self.request.logits if self.request is not None else "last"

    def to_json(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in CARD_KEYS}
        data["suggestions"] = [s.to_json() for s in self.suggestions]
        return data

    @property
    def device_peak_bytes(self) -> int:
        """What the device loses at the peak: on CUDA the allocator's reserved peak, else the tensors'."""
        return int(self.runtime["reserved_peak_bytes"]) if self.runtime else self.peak_bytes

    def fits_in(self, usable_bytes: int) -> bool:
        """The verdict, the one every answer shares (the plain estimate's, ``--fit``'s search, a
        sweep's table): what the device loses at the peak (on CUDA the allocator's reserved peak,
        workspaces and reserve included) against what it leaves. ``build.apply_device`` sets
        ``fits`` to this for the card's own device."""
        return self.device_peak_bytes <= usable_bytes

    def verdict(self, usable_bytes: int) -> str:
        headroom = usable_bytes - self.device_peak_bytes
        if headroom < 0:
            return f"does not fit ({format_bytes(-headroom)} over)"
        return f"fits ({format_bytes(headroom)} headroom)"

    def to_text(self) -> str:
        """Plain lines for a terminal: peak, phases, verdict, changes."""
        lines = [
            f"{self.model or 'model'}: peak {format_bytes(self.peak_bytes)} (weights {format_bytes(self.weights_bytes)}, "
            f"KV cache at the end {format_bytes(self.kv_cache_bytes)})"
        ]
        if self.request is not None:
            lines.append(f"  request: {self.request.describe()}")
        tokens = ", ".join(f"{v} {k}" for k, v in self.tokens.items() if v)
        if tokens:
            lines.append(f"  tokens per sequence: {tokens}")
        for name, info in self.phases.items():
            lines.append(f"  {name:<8} {format_bytes(info['peak_bytes']):>12}")
        lines += [f"  {line}" for line in self.provenance()]
        if self.runtime:
            from memwarden.estimation.cuda_runtime import runtime_lines

            lines += [f"  {line}" for line in runtime_lines(self.runtime)]
        if self.usable_bytes is not None:
            lines.append(
                f"  {self.device}: usable {format_bytes(self.usable_bytes)}, {self.verdict(self.usable_bytes)}"
            )
            if self.limit:
                lines.append(
                    f"  limit compared: {self.limit['kind']}, {format_bytes(self.limit['bytes'])} "
                    f"({self.limit['source']})"
                )
                if self.limit.get("killed_below_ram"):
                    lines.append(
                        f"  fits the {format_bytes(self.limit['ram_bytes'])} the OS leaves, but the OS kills "
                        "the app at its limit first"
                    )
        if self.fit:
            lines += [f"  {line}" for line in fit_lines(self.fit)]
        for s in self.suggestions:
            how = "re-run" if s.method == "rerun" else "arithmetic"
            mark = "fits" if s.fits else "does not fit"
            lines.append(f"  - {s.change}: {format_bytes(s.predicted_peak_bytes)}, {mark} ({how})")
        return "\n".join(lines)

    def provenance(self) -> list[str]:
        """How the numbers were made: generation steps run vs extrapolated, logits, versions."""
        out = []
        gen = self.generation
        if gen.get("extrapolated"):
            out.append(
                f"decode: {gen['steps_run']} of {gen['new_tokens']} steps run, the rest extrapolated "
                "(steady-state steps; KV growth per token exact)"
            )
        out.append(
            "logits: every prompt position, float32 (older transformers)"
            if self.logits == "full"
            else "logits: last position only in prefill"
        )
        if self.processor is not None:
            out.append(
                "image processor: the checkpoint's preprocessor_config.json"
                if self.processor == "checkpoint"
                else "image processor: the class's defaults, sized by the config (no preprocessor_config.json)"
            )
        if self.versions:
            out.append("code run: " + ", ".join(f"{k} {v}" for k, v in self.versions.items()))
        return out + self.quantization_lines()

    def quantization_lines(self) -> list[str]:
        """The checkpoint's method, what stayed unquantized and why, each transient of its kernels."""
        q = self.quantization
        if not q:
            return []
        what = q.get("description") or "the checkpoint's own tensors"
        out = [f"weights stored as: {what} ({q.get('converted_linears', 0)} Linear layers quantized)"]
        for why, paths in (q.get("unquantized") or {}).items():
            shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
            out.append(f"unquantized ({why}): {shown}")
        for t in q.get("transients") or []:
            where = "in the peak" if t["in_peak"] else "not in the peak"
            out.append(f"transient, {where}: {t['what']}: {format_bytes(t['bytes'])} [{t['source']}]")
        return out

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
            *(f"- {line}" for line in self.provenance()),
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


def fit_lines(fit: dict[str, Any]) -> list[str]:
    """The answer of ``--fit``: the largest value, its peak against the budget, the settings to type."""
    peak = "reserved peak" if fit.get("compared") == "reserved_peak_bytes" else "peak"
    out = [
        f"largest {fit['solve']} that fits: {fit['value']} ({peak} {format_bytes(fit['peak_bytes'])} of "
        f"{format_bytes(fit['budget_bytes'])})"
    ]
    if fit.get("next_refused"):
        out.append(f"next step {fit['next_value']}: refused ({fit['next_refused']})")
    elif fit.get("next_value") is not None:
        out.append(f"next step {fit['next_value']}: {peak} {format_bytes(fit['next_peak_bytes'])}, does not fit")
    for where, text in (fit.get("settings") or {}).items():
        out.append(f"{where}: {text}")
    return out


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
