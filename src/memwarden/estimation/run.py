"""``memwarden.estimate(model, ...)``: peak memory of a request, before downloading weights.

Importing this module does not import torch (``import memwarden`` binds ``estimate``); the
meta-device run imports it when an estimate runs.

The model is built from its config on the meta device and transformers' ``generate()`` runs on
it under :class:`memwarden.record.meta.capture.MetaCapture`, which records the Trace a live run would;
:func:`memwarden.estimation.build.card_from_trace` turns it into a :class:`MemoryCard`; a long
generation runs two short ones and extrapolates the steady decode step
(:mod:`memwarden.estimation.steady`).

``model`` is a zoo name (``llava``, ``qwen2-vl:small``; tiny by default), a named real model
(``llava-1.5-7b``: a config.json shipped in ``memwarden/models/configs``), or the path of a
config.json or of a folder holding one, of any family transformers' auto mappings can generate
with (:mod:`memwarden.estimation.families`).

The request: images of a real config go through the family's own image processor (resized,
tiled, pixel-limited as it does; :mod:`memwarden.estimation.request`); the zoo's tiny models take
their native size. ``prompt_tokens`` counts every text token, markers included, and the
placeholders come on top; no image means a text-only request; audio is log-mel frames at 100
per second; generation is greedy for exactly ``new_tokens`` steps.

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

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from memwarden.errors import InputError, MemwardenError
from memwarden.estimation.card import MemoryCard, Request
from memwarden.estimation.collector import EstimateCollector
from memwarden.estimation.measure import Progress, card_for, check_request
from memwarden.estimation.rerun import image_multiple, replace_request, rerun_suggestions
from memwarden.estimation.resolve import CONFIG_DIR, resolve_model, shipped_name
from memwarden.estimation.suggest import rank_suggestions

__all__ = ["SweepResult", "estimate", "load_device", "parse_image", "parse_video", "sweep"]

P = ParamSpec("P")
T = TypeVar("T")


def config_errors(fn: Callable[P, T]) -> Callable[P, T]:
    """A config.json of the user's that passed ``resolve_model``'s checks can still hold a value that
    transformers' own code trips over while building or running the meta model (a sub-config of
    another family, a rope setting of the wrong type, sizes that do not divide): that is a bad
    input, so it becomes one InputError naming the file and what transformers said. The zoo's and
    the shipped configs are ours: an exception there is a bug and goes up as it is."""

    @functools.wraps(fn)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> T:
        model = args[0] if args else kwargs.get("model")
        try:
            return fn(*args, **kwargs)
        except (MemwardenError, MemoryError):
            raise
        except Exception as exc:
            if not _user_config(model):
                raise
            what = " ".join(str(exc).split())[:200]
            raise InputError(
                f"{model}: this config cannot be built or run by transformers ({type(exc).__name__}: {what})"
            ) from exc

    return guarded


def _user_config(model: Any) -> bool:
    from memwarden.models import zoo

    name = str(model).partition(":")[0]
    if name in zoo.NAMES or (CONFIG_DIR / f"{model}.json").is_file():
        return False
    # a shipped config by its Hub id, unless a local path of that name (the user's) comes first
    return Path(str(model)).expanduser().exists() or shipped_name(str(model)) is None


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


def parse_video(text: str) -> tuple[int, int, int]:
    """'448x448x16' -> (448, 448, 16): W x H px, frames; else InputError."""
    parts = str(text).lower().split("x")
    try:
        whf = tuple(int(v) for v in parts)
    except ValueError:
        whf = ()
    if len(whf) != 3 or any(v <= 0 for v in whf):
        raise InputError(f"--video takes WIDTHxHEIGHTxFRAMES, e.g. 448x448x16; got {text!r}")
    return whf


@config_errors
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
    max_pixels: int | None = None,
    logits: str = "last",
    videos: list[tuple[int, int, int]] | tuple[tuple[int, int, int], ...] | None = None,
    device: Any = None,
    suggest: bool = True,
    progress: Progress | None = None,
    fit: Any = None,
    solve: str | None = None,
    cache: bool = False,
) -> MemoryCard:
    """Peak memory of ``model`` serving one request, per phase; with ``device`` (a profile id, a
    TOML path or a DeviceProfile) the verdict and, when it does not fit, ranked changes that do.

    ``dtype`` None: the checkpoint's (``torch_dtype``/``dtype`` of config.json; float32 when it
    states none). ``max_pixels``: a dynamic-resolution processor's pixel limit per image.
    ``videos``: (W, H, frames) each, framed as the family's video processor does.
    ``logits="full"``: every prompt position's logits in float32, as transformers before 4.45
    computed them. ``progress(text, fraction=None)`` is told what the estimate is doing.
    ``cache``: answer a repeated estimate of a shipped config from the card kept on disk the first
    time (:mod:`memwarden.estimation.card_store`; the command line asks for it)."""
    key = _store_key(model, locals()) if cache and fit is None and solve is None else None
    if key is not None:
        from memwarden.estimation.card_store import load_card

        kept = load_card(key)
        if kept is not None:
            return kept
    card = _estimate(
        model,
        images,
        videos,
        audio_seconds,
        prompt_tokens,
        new_tokens,
        batch,
        dtype,
        weights_dtype,
        kv_dtype,
        max_pixels,
        logits,
        device,
        suggest,
        progress,
        fit,
        solve,
    )
    if key is not None:
        from memwarden.estimation.card_store import save_card

        save_card(key, card)
    return card


_STORE_SETTINGS = (
    "images",
    "videos",
    "audio_seconds",
    "prompt_tokens",
    "new_tokens",
    "batch",
    "dtype",
    "weights_dtype",
    "kv_dtype",
    "max_pixels",
    "logits",
    "suggest",
)


def _store_key(model: str, given: dict[str, Any]) -> str | None:
    """The disk store's key of this estimate, or None where it is not kept: a model that is not a
    shipped config (a user's folder or file can change under its path), the store turned off, or
    a request that fails its checks (it fails below, as it would without the store)."""
    from memwarden.estimation.card_store import enabled, request_key

    if not enabled() or Path(str(model)).expanduser().exists() or shipped_name(str(model)) is None:
        return None
    settings = {k: given[k] for k in _STORE_SETTINGS}
    for k in ("images", "videos"):
        settings[k] = [list(v) for v in settings[k] or ()]
    try:
        device = load_device(given["device"]) if given["device"] is not None else None
    except MemwardenError:
        return None
    return request_key(str(model), settings, device)


def _estimate(
    model: str,
    images: list[tuple[int, int]] | tuple[tuple[int, int], ...] | None,
    videos: list[tuple[int, int, int]] | tuple[tuple[int, int, int], ...] | None,
    audio_seconds: float | None,
    prompt_tokens: int,
    new_tokens: int,
    batch: int,
    dtype: str | None,
    weights_dtype: str | None,
    kv_dtype: str | None,
    max_pixels: int | None,
    logits: str,
    device: Any,
    suggest: bool,
    progress: Progress | None,
    fit: Any,
    solve: str | None,
) -> MemoryCard:
    if progress is not None:  # transformers' import and the config's class take seconds before the run starts
        progress("reading the model's config", 0.01)
    with EstimateCollector() as collector:
        resolved = resolve_model(model)  # torch, transformers and the family's modeling module import here
        collector.imports_done()
        dtype = dtype or resolved.default_dtype
        req = Request(
            images=tuple(tuple(wh) for wh in (images or ())),  # type: ignore[misc]
            videos=tuple(tuple(whf) for whf in (videos or ())),  # type: ignore[misc]
            audio_seconds=audio_seconds,
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
            batch=batch,
            dtype=dtype,
            weights_dtype=weights_dtype,
            kv_dtype=kv_dtype,
            max_pixels=max_pixels,
            logits=logits,
        )
        check_request(req)
        profile = load_device(device) if device is not None else None
        if fit is not None or solve is not None:
            return _fit(resolved, req, fit, solve, profile, progress)
        kwargs = {"progress": progress} if progress is not None else {}
        card, _facts = card_for(resolved, req, profile, facts=True, **kwargs)
        if profile is not None and suggest and not card.fits:
            if progress is not None:
                progress("pricing the changes that would fit", 0.9)
            card.suggestions = rank_suggestions(rerun_suggestions(resolved, req, card, profile) + card.suggestions)
        return card


def _fit(
    resolved: Any, req: Request, fit: Any, solve: str | None, profile: Any, progress: Progress | None
) -> MemoryCard:
    """``fit`` (a byte count, a size like ``6GiB``, a device id or profile): the card of the largest
    ``solve`` value whose peak fits it, with the ``fit`` block. Each value is judged on the device
    (``fit``'s, else ``profile``) exactly as ``estimate(..., device=...)`` judges it."""
    from memwarden.estimation.fit import solve_fit
    from memwarden.units import parse_bytes

    if fit is None or solve is None:
        raise InputError("--fit and --solve go together: a budget (bytes or a device) and the setting to solve")
    budget_device = None
    if isinstance(fit, int) and not isinstance(fit, bool):
        budget = fit
    elif hasattr(fit, "usable_bytes"):
        budget_device = fit
    else:
        try:
            budget = parse_bytes(str(fit))
        except (InputError, ValueError):
            budget_device = load_device(fit)
    if budget_device is not None:
        if profile is not None and profile.id != budget_device.id:
            raise InputError(
                f"--fit names the device {budget_device.id} and --device-profile {profile.id}: give one device "
                "(or a byte budget with --fit, judged on the --device-profile)"
            )
        budget = int(budget_device.usable_bytes)
        profile = budget_device
    if progress is not None:
        progress(f"solving the largest {solve} that fits", 0.1)
    card, block = solve_fit(resolved, req, budget, solve, profile)
    card.fit = block
    return card


def load_device(device: Any) -> Any:
    if hasattr(device, "usable_bytes"):
        return device
    from memwarden.models.devices import load_profile

    return load_profile(str(device))


# -- sweeps ---------------------------------------------------------------------------------------

_SWEEP_IMAGE_SIDES = (224, 448, 672, 896, 1120, 1344)  # multiples of 28 (Qwen-VL's patch x merge)
_SWEEP_PROMPTS = (128, 512, 2048, 8192, 32768)
_SWEEP_AUDIO_SECONDS = (1.0, 5.0, 10.0, 20.0, 30.0)


class SweepResult:
    """Cards along each swept axis (image sizes, prompt lengths, audio lengths), each point's
    verdict per device (the card ``estimate(..., device=d)`` makes of it), and per device the
    largest point of each axis that fits."""

    def __init__(
        self,
        model: str,
        axes: dict[str, list[tuple[Any, MemoryCard]]],
        devices: list[Any],
        judged: dict[str, list[dict[str, MemoryCard]]] | None = None,
    ) -> None:
        self.model = model
        self.axes = axes
        self.devices = devices
        # axis -> per point: device id -> that point's card on the device (its verdict, its device peak)
        self.judged = judged if judged is not None else {a: [{} for _ in points] for a, points in axes.items()}

    def fits(self, axis: str, index: int, device: Any) -> bool:
        """Whether point ``index`` of ``axis`` fits ``device``: the plain estimate's verdict
        (``MemoryCard.fits_in``; on CUDA the reserved peak), where the sweep judged that device."""
        card = self.judged[axis][index].get(device.id) or self.axes[axis][index][1]
        return card.fits_in(int(device.usable_bytes))

    def limits(self) -> dict[str, dict[str, Any]]:
        """device id -> axis -> the largest value that fits (None when none does)."""
        out: dict[str, dict[str, Any]] = {}
        for d in self.devices:
            out[d.id] = {}
            for axis, points in self.axes.items():
                fitting = [value for i, (value, _card) in enumerate(points) if self.fits(axis, i, d)]
                out[d.id][axis] = fitting[-1] if fitting else None
        return out

    def _point_json(self, axis: str, index: int) -> dict[str, Any]:
        value, card = self.axes[axis][index]
        devices = {}
        for d in self.devices:  # the peak each verdict compared (on CUDA the reserved peak)
            judged = self.judged[axis][index].get(d.id) or card
            devices[d.id] = {"fits": self.fits(axis, index, d), "peak_bytes": judged.device_peak_bytes}
        return {"value": list(value) if isinstance(value, tuple) else value, "card": card.to_json(), "devices": devices}

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "axes": {
                axis: [self._point_json(axis, i) for i in range(len(points))] for axis, points in self.axes.items()
            },
            "devices": [{"id": d.id, "name": d.name, "usable_bytes": int(d.usable_bytes)} for d in self.devices],
            "limits": {
                dev: {k: (list(v) if isinstance(v, tuple) else v) for k, v in axes.items()}
                for dev, axes in self.limits().items()
            },
        }


@config_errors
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
    with EstimateCollector() as collector:
        resolved = resolve_model(model)
        collector.imports_done()
        return _sweep(
            resolved, images, prompt_tokens, audio_seconds, new_tokens, batch, dtype, weights_dtype, kv_dtype, devices
        )


def _sweep(
    resolved: Any,
    images: list[tuple[int, int]] | None,
    prompt_tokens: list[int] | None,
    audio_seconds: list[float] | None,
    new_tokens: int,
    batch: int,
    dtype: str | None,
    weights_dtype: str | None,
    kv_dtype: str | None,
    devices: list[Any] | None,
) -> SweepResult:
    from memwarden.models import zoo

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
    check_request(replace_request(base, images=base.images[:1]))
    cards: dict[str, list[tuple[Any, MemoryCard]]] = {}
    judged: dict[str, list[dict[str, MemoryCard]]] = {}
    field_of = {"image": "images", "prompt_tokens": "prompt_tokens", "audio_seconds": "audio_seconds"}
    for axis, values in axes.items():
        cards[axis], judged[axis] = [], []
        for value in values:
            req = replace_request(base, **{field_of[axis]: (value,) if axis == "image" else value})
            card, on_devices = _judged(resolved, req, profiles)
            cards[axis].append((value, card))
            judged[axis].append(on_devices)
    return SweepResult(resolved.name, cards, profiles, judged)


def _judged(resolved: Any, req: Request, devices: list[Any]) -> tuple[MemoryCard, dict[str, MemoryCard]]:
    """(the card of ``req``, device id -> the card ``estimate(..., device=d)`` makes of it).

    On a CUDA device the verdict needs the request's own allocation sequence (the allocator's
    reserve is replayed from it), so that card is ``card_for`` with the device, as the plain
    estimate makes it. Elsewhere ``card_for`` with a device only applies it to the device-free card
    (``build.apply_device``), so that is done here without running the request again."""
    import dataclasses

    from memwarden.estimation.build import apply_device
    from memwarden.estimation.cuda_runtime import is_cuda

    judged = {d.id: card_for(resolved, req, d)[0] for d in devices if is_cuda(d)}
    first = next(iter(judged.values()), None)
    if first is None:
        card = card_for(resolved, req)[0]
    else:  # the same run's card without the device (the tensors' peak does not depend on it)
        card = dataclasses.replace(
            first,
            runtime=None,
            usable_bytes=None,
            fits=None,
            headroom_bytes=None,
            limit=None,
            device=None,
            device_id=None,
        )
    for d in devices:
        if not is_cuda(d):
            judged[d.id] = dataclasses.replace(card)
            apply_device(judged[d.id], d)
    return card, judged
