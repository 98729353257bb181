"""``memwarden.estimate(model, ...)``: peak memory of a request, before downloading weights.

Importing this module does not import torch (``import memwarden`` binds ``estimate``); the
meta-device run imports it when an estimate runs.

The model is built from its config on the meta device and transformers' ``generate()`` runs on
it under :class:`memwarden.capture.meta.capture.MetaCapture`, which records the Trace a live run would;
:func:`memwarden.estimate.card.card_from_trace` turns it into a :class:`MemoryCard`.

``model`` is a zoo name (``llava``, ``qwen2-vl:small``; tiny by default), a named real model
(``llava-1.5-7b``: a config.json shipped in ``memwarden/models/configs``), or the path of a
config.json or of a folder holding one. Families: those of the zoo (LLaVA, Qwen2-VL,
Qwen2.5-VL, PaliGemma, Idefics3/SmolVLM, Gemma 3, Qwen2-Audio).

The request means exactly: each image is already resized to (W, H) (no tiling) and fed as the
architecture's native pixel input with the placeholder tokens it requires; ``prompt_tokens``
counts every text token, markers included, and the placeholders come on top; audio is log-mel
frames at 100 per second; generation is greedy for exactly ``new_tokens`` steps.

Quantized storage is emulated on the meta model, so the estimate runs the same way:

- ``weights_dtype="int8"``: every nn.Linear but the output head holds an int8 weight and an fp32
  scale per output row, and multiplies with a fused int8 weight-only kernel (no dequantized copy,
  like ``torch._weight_int8pack_mm``).
- ``weights_dtype="int4"``: NF4 as bitsandbytes stores it (packed 4-bit codes, one fp32 absmax
  per 64 weights); a call with more than one token dequantizes the whole weight to the compute
  dtype first (bitsandbytes' path), a one-token call runs the fused GEMV.
- ``kv_dtype="float8"``: transformers' own ``QuantizedCache("fp8")``. ``"int8"``/``"int4"``: the
  ``QuantizedCache`` of the quanto/hqq backends (a 128-token residual window in the compute
  dtype, the rest quantized per group of 64 with a scale and zero point, dequantized whole
  for attention), with the codes held in a 1-byte stand-in dtype.
"""

from __future__ import annotations

import copy
from typing import Any

from memwarden.errors import InputError
from memwarden.estimate.card import (
    MemoryCard,
    Request,
    Suggestion,
    apply_device,
    card_from_trace,
    rank_suggestions,
)
from memwarden.estimate.resolve import ResolvedModel, resolve_model

__all__ = ["SweepResult", "estimate", "parse_image", "run_estimate", "sweep"]

DTYPES = ("float32", "float16", "bfloat16")
WEIGHT_DTYPES = ("int8", "int4")
KV_DTYPES = ("float8", "int8", "int4")
_SUGGEST_IMAGE_STEPS = 6  # re-runs spent searching for the largest image that fits


# -- request checks ---------------------------------------------------------------------------


def _check_request(req: Request) -> None:
    for label, value, low in (
        ("prompt_tokens", req.prompt_tokens, 1),
        ("new_tokens", req.new_tokens, 1),
        ("batch", req.batch, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InputError(f"{label} must be an integer >= {low}; got {value!r}")
    if req.dtype not in DTYPES:
        raise InputError(f"dtype must be one of {', '.join(DTYPES)}; got {req.dtype!r}")
    if req.weights_dtype is not None and req.weights_dtype not in WEIGHT_DTYPES:
        raise InputError(
            f"weights_dtype must be one of {', '.join(WEIGHT_DTYPES)} (or omitted); got {req.weights_dtype!r}"
        )
    if req.kv_dtype is not None and req.kv_dtype not in KV_DTYPES:
        raise InputError(f"kv_dtype must be one of {', '.join(KV_DTYPES)} (or omitted); got {req.kv_dtype!r}")
    for wh in req.images:
        if len(wh) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in wh):
            raise InputError(f"an image size is (width, height) in positive pixels; got {wh!r}")
    if req.audio_seconds is not None and (not isinstance(req.audio_seconds, (int, float)) or not req.audio_seconds > 0):
        raise InputError(f"audio_seconds must be a positive number; got {req.audio_seconds!r}")


def parse_image(text: str) -> tuple[int, int]:
    """'448x336' -> (448, 336); else InputError."""
    w, sep, h = str(text).lower().partition("x")
    try:
        wh = (int(w), int(h))
    except ValueError:
        wh = None
    if not sep or wh is None or wh[0] <= 0 or wh[1] <= 0:
        raise InputError(f"--image takes WIDTHxHEIGHT in pixels, e.g. 448x336; got {text!r}")
    return wh


# -- running an estimate ----------------------------------------------------------------------


def zoo_family(resolved: ResolvedModel) -> bool:
    """Whether the zoo's request builder knows this family (its requests stay exactly as before)."""
    from memwarden.models import zoo

    return any(zoo.spec(n).family == resolved.family for n in zoo.NAMES)


def _inputs(resolved: ResolvedModel, req: Request, model: Any) -> tuple[dict[str, Any], dict[str, int]]:
    from memwarden.capture.meta.capture import meta_inputs
    from memwarden.estimate.request import build_request
    from memwarden.models import zoo

    if req.audio_seconds is not None and not zoo_family(resolved):
        raise InputError(f"audio requests for model_type {resolved.family!r} are not supported yet")
    if not zoo_family(resolved) or (not req.images and req.audio_seconds is None):
        return build_request(
            model, resolved.config, images=req.images, prompt_tokens=req.prompt_tokens,
            new_tokens=req.new_tokens, batch=req.batch, max_pixels=getattr(req, "max_pixels", None),
        )  # fmt: skip
    if len(req.images) > 1:
        raise InputError(f"{resolved.family} requests take one image each here; got {len(req.images)}")
    config = resolved.config
    if not resolved.source.startswith("zoo:"):
        # Prompt text is drawn below the lowest special id, so that no random word is a placeholder.
        config = copy.deepcopy(config)
        specials = [
            v for k, v in vars(resolved.config).items()
            if k.endswith(("token_id", "token_index")) and isinstance(v, int) and v > 1000
        ]  # fmt: skip
        text = config.get_text_config()
        if specials:
            text.vocab_size = min(min(specials), text.vocab_size)
    inputs = zoo.make_inputs(
        config,
        image_size=req.images[0] if req.images else None,
        audio_seconds=req.audio_seconds,
        prompt_tokens=req.prompt_tokens,
        batch=req.batch,
    )
    return meta_inputs(inputs), {}


def run_estimate(resolved: ResolvedModel, req: Request) -> tuple[Any, Any]:
    """(meta Trace, meta model) of one request."""
    import torch

    from memwarden.capture.meta.capture import MetaCapture
    from memwarden.estimate.metamodel import model_for, quantized_cache

    _check_request(req)
    context = getattr(resolved.config.get_text_config(), "max_position_embeddings", None)
    if isinstance(context, int) and req.prompt_tokens + req.new_tokens > context:
        raise InputError(
            f"{req.prompt_tokens} prompt tokens + {req.new_tokens} new tokens exceed {resolved.name}'s context of "
            f"{context} (max_position_embeddings)"
        )
    model = model_for(resolved, req.dtype, req.weights_dtype)
    inputs, _tokens = _inputs(resolved, req, model)
    kwargs: dict[str, Any] = {"do_sample": False, "num_beams": 1, "eos_token_id": None, "pad_token_id": 0}
    if req.kv_dtype is not None:
        kwargs["cache"] = quantized_cache(resolved, req.kv_dtype)
    metadata = {"model": resolved.name, "request": req.to_json()}
    with MetaCapture(model, inputs, metadata=metadata) as cap, torch.inference_mode():
        model.generate(**inputs, max_new_tokens=req.new_tokens, min_new_tokens=req.new_tokens, **kwargs)
    return cap.trace, model


def estimate(
    model: str,
    *,
    images: list[tuple[int, int]] | tuple[tuple[int, int], ...] | None = None,
    audio_seconds: float | None = None,
    prompt_tokens: int = 128,
    new_tokens: int = 16,
    batch: int = 1,
    dtype: str | None = None,
    weights_dtype: str | None = None,
    kv_dtype: str | None = None,
    device: Any = None,
    suggest: bool = True,
) -> MemoryCard:
    """Peak memory of ``model`` serving one request, per phase; with ``device`` (a profile id, a
    TOML path or a DeviceProfile) the verdict and, when it does not fit, ranked changes that do."""
    resolved = resolve_model(model)
    dtype = dtype or resolved.default_dtype
    req = Request(
        images=tuple(tuple(wh) for wh in (images or ())),  # type: ignore[misc]
        audio_seconds=audio_seconds,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        batch=batch,
        dtype=dtype,
        weights_dtype=weights_dtype,
        kv_dtype=kv_dtype,
    )
    _check_request(req)
    profile = load_device(device) if device is not None else None
    from memwarden.estimate.metamodel import model_facts

    trace, meta_model = run_estimate(resolved, req)
    facts = model_facts(resolved, meta_model, req)
    card = card_from_trace(trace, model=resolved.name, request=req, facts=facts, device=profile)
    if profile is not None and suggest and not card.fits:
        card.suggestions = rank_suggestions(_rerun_suggestions(resolved, req, card, profile) + card.suggestions)
    return card


def load_device(device: Any) -> Any:
    if hasattr(device, "usable_bytes"):
        return device
    from memwarden.models.devices import load_profile

    return load_profile(str(device))


def card_for(resolved: ResolvedModel, req: Request, device: Any = None) -> MemoryCard:
    """The card of one request without suggestions (sweeps)."""
    trace, meta_model = run_estimate(resolved, req)
    card = card_from_trace(trace, model=resolved.name, request=req)
    if device is not None:
        apply_device(card, device)
    return card


# -- suggestions that re-run the estimate ---------------------------------------------------------


def _rerun_suggestions(resolved: ResolvedModel, req: Request, card: MemoryCard, device: Any) -> list[Suggestion]:
    """Exact predictions: quantized weights and KV cache (emulated), and the largest image that fits."""
    out: list[Suggestion] = []
    usable = int(device.usable_bytes)
    wide = {"float32": 4, "float16": 2, "bfloat16": 2}
    checkpoint = resolved.checkpoint_dtype
    if checkpoint is not None and wide[req.dtype] > wide[checkpoint]:
        peak = card_for(resolved, _replace(req, dtype=checkpoint)).peak_bytes
        out.append(Suggestion(change=f"use the checkpoint's dtype ({checkpoint}; the request ran in {req.dtype})",
                              setting={"dtype": checkpoint}, kind="dtype", predicted_peak_bytes=peak,
                              fits=peak <= usable, headroom_bytes=usable - peak, method="rerun",
                              note="meta estimate re-run in the dtype config.json states"))  # fmt: skip

    def suggestion(kind: str, change: str, setting: dict[str, Any], peak: int, note: str) -> Suggestion:
        return Suggestion(change=change, setting=setting, kind=kind, predicted_peak_bytes=peak, fits=peak <= usable,
                          headroom_bytes=usable - peak, method="rerun", note=note)  # fmt: skip

    for qdtype in WEIGHT_DTYPES:
        if req.weights_dtype == "int4" or req.weights_dtype == qdtype:
            continue
        peak = card_for(resolved, _replace(req, weights_dtype=qdtype)).peak_bytes
        card.suggestions = [s for s in card.suggestions if s.setting != {"weights_dtype": qdtype}]
        out.append(suggestion("weights_dtype", f"{qdtype} weights (weight-only quantization of every linear layer)",
                              {"weights_dtype": qdtype}, peak, "meta estimate re-run with emulated quantized linears"))  # fmt: skip
    from memwarden.estimate.metamodel import kv_quantizable

    if req.kv_dtype is None and card.kv_cache_bytes and kv_quantizable(resolved):
        peak = card_for(resolved, _replace(req, kv_dtype="int8")).peak_bytes
        card.suggestions = [s for s in card.suggestions if s.kind != "kv_dtype"]
        out.append(suggestion("kv_dtype", "int8 KV cache (quantized cache, 128-token residual window)",
                              {"kv_dtype": "int8"}, peak, "meta estimate re-run with an emulated quantized cache"))  # fmt: skip
    best = _largest_image(resolved, req, usable) if card.weights_bytes < usable else None
    if best is not None:
        wh, peak = best
        out.append(suggestion("max_image", f"images of at most {wh[0]}x{wh[1]} px", {"images": [list(wh)]}, peak,
                              "largest size of the request's aspect ratio that fits, by re-running the estimate"))  # fmt: skip
    return out


def image_multiple(resolved: ResolvedModel) -> int | None:
    """patch x merge of a dynamic-resolution (Qwen-VL style) vision tower; None for a fixed or tiled one."""
    vc = getattr(resolved.config, "vision_config", None)
    patch, merge = getattr(vc, "patch_size", None), getattr(vc, "spatial_merge_size", None)
    if not isinstance(patch, int) or not isinstance(merge, int) or not hasattr(vc, "temporal_patch_size"):
        return None
    return patch * merge


def _replace(req: Request, **changes: Any) -> Request:
    data = {k: getattr(req, k) for k in req.__dataclass_fields__}
    data.update(changes)
    return Request(**data)


def _largest_image(resolved: ResolvedModel, req: Request, usable: int) -> tuple[tuple[int, int], int] | None:
    """Binary search over the request's image scaled down in steps of the model's image multiple."""
    if not req.images or image_multiple(resolved) is None:
        return None
    multiple = int(image_multiple(resolved) or 1)
    w, h = req.images[0]
    top = max(w, h) // multiple  # size in multiples along the long side
    lo, hi, best = 1, top, None
    for _ in range(_SUGGEST_IMAGE_STEPS):
        if lo > hi:
            break
        mid = (lo + hi) // 2
        scale = mid / top
        wh = (
            max(multiple, round(w * scale / multiple) * multiple),
            max(multiple, round(h * scale / multiple) * multiple),
        )
        peak = card_for(resolved, _replace(req, images=(wh,))).peak_bytes
        if peak <= usable:
            best, lo = (wh, peak), mid + 1
        else:
            hi = mid - 1
    return best


# -- sweeps ---------------------------------------------------------------------------------------

_SWEEP_IMAGE_SIDES = (224, 448, 672, 896, 1120, 1344)  # multiples of 28 (Qwen-VL's patch x merge)
_SWEEP_PROMPTS = (128, 512, 2048, 8192, 32768)
_SWEEP_AUDIO_SECONDS = (1.0, 5.0, 10.0, 20.0, 30.0)


class SweepResult:
    """Cards along each swept axis (image sizes, prompt lengths, audio lengths) and, per device,
    the largest point of each axis that fits."""

    def __init__(self, model: str, axes: dict[str, list[tuple[Any, MemoryCard]]], devices: list[Any]) -> None:
        self.model = model
        self.axes = axes
        self.devices = devices

    def limits(self) -> dict[str, dict[str, Any]]:
        """device id -> axis -> the largest value that fits (None when none does)."""
        out: dict[str, dict[str, Any]] = {}
        for d in self.devices:
            out[d.id] = {}
            for axis, points in self.axes.items():
                fitting = [value for value, card in points if card.peak_bytes <= d.usable_bytes]
                out[d.id][axis] = fitting[-1] if fitting else None
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "axes": {
                axis: [{"value": list(v) if isinstance(v, tuple) else v, "card": c.to_json()} for v, c in points]
                for axis, points in self.axes.items()
            },
            "devices": [{"id": d.id, "name": d.name, "usable_bytes": int(d.usable_bytes)} for d in self.devices],
            "limits": {
                dev: {k: (list(v) if isinstance(v, tuple) else v) for k, v in axes.items()}
                for dev, axes in self.limits().items()
            },
        }


def sweep(
    model: str,
    *,
    images: list[tuple[int, int]] | None = None,
    prompt_tokens: list[int] | None = None,
    audio_seconds: list[float] | None = None,
    new_tokens: int = 16,
    batch: int = 1,
    dtype: str | None = None,
    weights_dtype: str | None = None,
    kv_dtype: str | None = None,
    devices: list[Any] | None = None,
) -> SweepResult:
    """Estimate along each axis (the other axes at their first value) to find where a model stops
    fitting. An axis given one value or none is swept over a default grid for the model: square
    images (dynamic-resolution models; a fixed-resolution model takes its native size only),
    prompts up to its context length, audio up to its encoder window."""
    from memwarden.models import zoo

    resolved = resolve_model(model)
    dtype = dtype or resolved.default_dtype
    audio_config = getattr(resolved.config, "audio_config", None)
    modality = (
        "audio" if audio_config is not None and getattr(resolved.config, "vision_config", None) is None else "vision"
    )
    profiles = [load_device(d) for d in devices or []]
    context = int(getattr(resolved.config.get_text_config(), "max_position_embeddings", 4096) or 4096)
    axes: dict[str, list[Any]] = {}
    if modality == "vision":
        if images and len(images) > 1:
            axes["image"] = [tuple(wh) for wh in images]
        elif image_multiple(resolved) is not None:
            axes["image"] = [(side, side) for side in _SWEEP_IMAGE_SIDES]
    else:
        if audio_seconds and len(audio_seconds) > 1:
            axes["audio_seconds"] = list(audio_seconds)
        else:
            window = float(resolved.config.audio_config.max_source_positions * 2 / zoo.MEL_FRAMES_PER_SECOND)
            axes["audio_seconds"] = [s for s in _SWEEP_AUDIO_SECONDS if s <= window]
    if prompt_tokens and len(prompt_tokens) > 1:
        axes["prompt_tokens"] = list(prompt_tokens)
    else:
        axes["prompt_tokens"] = [n for n in _SWEEP_PROMPTS if n + 1024 <= context] or [min(_SWEEP_PROMPTS)]
    base = Request(
        images=(tuple(images[0]),) if images else (),  # type: ignore[arg-type]
        audio_seconds=audio_seconds[0] if audio_seconds else None,
        prompt_tokens=prompt_tokens[0] if prompt_tokens else 128,
        new_tokens=new_tokens,
        batch=batch,
        dtype=dtype,
        weights_dtype=weights_dtype,
        kv_dtype=kv_dtype,
    )
    _check_request(_replace(base, images=base.images[:1]))
    cards: dict[str, list[tuple[Any, MemoryCard]]] = {}
    field_of = {"image": "images", "prompt_tokens": "prompt_tokens", "audio_seconds": "audio_seconds"}
    for axis, values in axes.items():
        cards[axis] = []
        for value in values:
            req = _replace(base, **{field_of[axis]: (value,) if axis == "image" else value})
            cards[axis].append((value, card_for(resolved, req)))
    return SweepResult(resolved.name, cards, profiles)
