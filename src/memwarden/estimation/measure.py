"""Running one request on the meta model: the checks, the inputs, ``generate()`` under
:class:`memwarden.record.meta.capture.MetaCapture`, and the card of the run.

A long generation is not run step by step: two runs of ``_MEASURED_NEW_TOKENS`` and one more new
tokens give the steady-state decode step (:mod:`memwarden.estimation.steady`), extrapolated to the
requested length. Where the steps are not steady (a quantized KV cache re-quantizes every 128
tokens; a sliding window fills up later than the measured steps reach) every step is run.
Importing this module does not import torch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from memwarden.errors import InputError
from memwarden.estimation.build import card_from_trace
from memwarden.estimation.card import MemoryCard, ModelFacts, Request
from memwarden.estimation.request_media import MAX_AUDIO_SECONDS
from memwarden.estimation.resolve import ResolvedModel
from memwarden.estimation.steady import Extrapolated, extrapolate_decode
from memwarden.units import DTYPE_BYTES

__all__ = [
    "DTYPES",
    "KV_DTYPES",
    "LOGITS",
    "WEIGHT_DTYPES",
    "RequestError",
    "card_for",
    "check_request",
    "measure",
    "run_estimate",
]

DTYPES = ("float32", "float16", "bfloat16")
WEIGHT_DTYPES = ("int8", "int4")
KV_DTYPES = ("float8", "int8", "int4")
LOGITS = ("last", "full")
# The shorter of the two runs a long generation is extrapolated from: the longer one's decode steps
# 2-4 are the three regular windows checked for steady state (step 1 may still set up the cache).
_MEASURED_NEW_TOKENS = 5
_STEADY_MARGIN = 4  # decode steps run past a sliding window's filling before steps count as steady

Progress = Callable[..., None]  # progress(text, fraction=None)


def _quiet(text: str, fraction: float | None = None) -> None:
    return None


class RequestError(InputError, ValueError):
    """A request setting out of range: a bad input (the CLI prints it as one line) and a ValueError
    for callers of the API."""


def check_request(req: Request) -> None:
    """Every setting of ``req`` checked before anything is built: one RequestError naming it."""
    try:
        _check_request(req)
    except RequestError:
        raise
    except InputError as exc:
        raise RequestError(str(exc)) from None


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
    if req.logits not in LOGITS:
        raise InputError(f"logits must be one of {', '.join(LOGITS)}; got {req.logits!r}")
    for wh in req.images:
        if len(wh) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in wh):
            raise InputError(f"an image size is (width, height) in positive pixels; got {wh!r}")
    for whf in req.videos:
        if len(whf) != 3 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in whf):
            raise InputError(f"a video is (width, height, frames), positive integers; got {whf!r}")
    seconds = req.audio_seconds
    # inf passes "> 0" and nan fails every comparison: both are refused here, before an int() of them
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_AUDIO_SECONDS
    ):
        raise InputError(
            f"audio_seconds must be a finite number of seconds in (0, {MAX_AUDIO_SECONDS:g}]; got {seconds!r}"
        )
    if req.max_pixels is not None and (
        isinstance(req.max_pixels, bool) or not isinstance(req.max_pixels, int) or not 1 <= req.max_pixels <= 1 << 26
    ):
        raise InputError(f"max_pixels must be an integer from 1 to {1 << 26}; got {req.max_pixels!r}")


def zoo_family(resolved: ResolvedModel) -> bool:
    """Whether the zoo's request builder knows this family (its requests stay exactly as before)."""
    from memwarden.models import zoo

    return any(zoo.spec(n).family == resolved.family for n in zoo.NAMES)


def _inputs(resolved: ResolvedModel, req: Request, model: Any) -> tuple[dict[str, Any], dict[str, int]]:
    from memwarden.estimation.request import build_request
    from memwarden.models import zoo
    from memwarden.record.meta.capture import meta_inputs

    # The zoo's tiny models keep the zoo's builder (one image per row, exactly the native size) and
    # so does the zoo's audio family; real configs' images, videos and other families' audio go
    # through the family's own processors, resized, tiled and chunked as they do.
    zoo_audio = req.audio_seconds is not None and zoo_family(resolved)
    if not resolved.source.startswith("zoo:") and not zoo_audio:
        zoo_request = False
    else:
        zoo_request = zoo_family(resolved) and len(req.images) <= 1 and req.max_pixels is None and not req.videos
    if not zoo_request or (not req.images and req.audio_seconds is None):
        return build_request(
            model,
            resolved.config,
            images=req.images,
            prompt_tokens=req.prompt_tokens,
            new_tokens=req.new_tokens,
            batch=req.batch,
            max_pixels=req.max_pixels,
            videos=req.videos,
            audio_seconds=req.audio_seconds,
            processor_settings=resolved.processor_settings,
        )
    config = resolved.config
    if not resolved.source.startswith("zoo:"):
        # Prompt text is drawn below the lowest special id, so that no random word is a placeholder.
        config = copy.deepcopy(config)
        specials = [
            v
            for k, v in vars(resolved.config).items()
            if k.endswith(("token_id", "token_index")) and isinstance(v, int) and v > 1000
        ]
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


def _prepare(resolved: ResolvedModel, req: Request) -> tuple[Any, dict[str, Any], dict[str, int]]:
    """(the meta model, generate()'s inputs, the request's tokens per sequence by modality; empty
    for the zoo's own requests)."""
    from memwarden.estimation.metamodel import model_for
    from memwarden.estimation.prompt_ids import context_of

    check_request(req)
    context = context_of(resolved.config)
    if isinstance(context, int) and req.prompt_tokens + req.new_tokens > context:
        raise InputError(
            f"{req.prompt_tokens} prompt tokens + {req.new_tokens} new tokens exceed {resolved.name}'s context of "
            f"{context} (max_position_embeddings)"
        )
    model = model_for(resolved, req.dtype, req.weights_dtype)
    inputs, tokens = _inputs(resolved, req, model)
    _check_media_given(resolved, model, inputs)
    return model, inputs, tokens


# What a model's generate() cannot run without, in the words of the request that carries it.
_MEDIA_FLAGS = {"pixel_values": "an image (--image)", "input_features": "audio (--audio SECONDS)"}


def _check_media_given(resolved: ResolvedModel, model: Any, inputs: dict[str, Any]) -> None:
    """A model whose generate() needs a medium (BLIP-2's and InstructBLIP's ``pixel_values`` have no
    default; an encoder-decoder's encoder input, Whisper's ``input_features``) is refused without it,
    in one line, before transformers fails inside generate()."""
    import inspect

    params = inspect.signature(type(model).generate).parameters.values()
    needed = [
        p.name
        for p in params
        if p.default is inspect.Parameter.empty
        and p.name != "self"
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    main_input = str(getattr(model, "main_input_name", ""))
    if getattr(resolved.config, "is_encoder_decoder", False) and main_input in _MEDIA_FLAGS:
        needed.append(main_input)  # Whisper's encoder reads audio; Florence-2's reads the prompt's ids
    missing = [name for name in dict.fromkeys(needed) if name and name not in inputs]
    if missing:
        what = " and ".join(_MEDIA_FLAGS.get(name, name) for name in missing)
        raise InputError(f"{resolved.name} generates only from {what}; the request has none")


def refusal(resolved: ResolvedModel, req: Request) -> str | None:
    """Why the model does not take ``req`` (its context, its media markers), or None when it
    does: the request is built on the meta model, nothing runs (a fraction of an estimate)."""
    try:
        _prepare(resolved, req)
    except InputError as exc:
        return str(exc)
    return None


def _generate(
    resolved: ResolvedModel,
    req: Request,
    model: Any,
    inputs: dict[str, Any],
    new_tokens: int,
    tokens: dict[str, int] | None = None,
) -> Any:
    """The meta Trace of ``generate()`` making ``new_tokens`` tokens greedily. ``tokens``: the
    request's tokens per sequence by modality, as the request builder counted them."""
    import torch

    from memwarden.estimation.metamodel import capture_for, quantized_cache
    from memwarden.record.inputs import step_tokens

    kwargs: dict[str, Any] = {
        "do_sample": False,
        "num_beams": 1,
        "eos_token_id": None,
        "pad_token_id": _pad_id(resolved),
    }
    if req.kv_dtype is not None:
        kwargs["cache"] = quantized_cache(resolved, req.kv_dtype)
    hook = None
    if req.logits == "full":
        # transformers before 4.45 computed every prompt position's logits in prefill and upcast them
        # to float32 in the model's forward (``logits = logits.float()``); 0 keeps them all.
        kwargs["logits_to_keep"] = 0
        head = model.get_output_embeddings()
        if head is not None and req.dtype != "float32":
            hook = head.register_forward_hook(lambda _module, _args, out: out.float())
    metadata: dict[str, Any] = {"model": resolved.name, "request": req.to_json(), "new_tokens_run": new_tokens}
    fed = step_tokens(model, inputs)
    if fed is not None:
        # the prompt as generate() is given it: an encoder-decoder's root calls take decoder ids only
        metadata["input_tokens"] = fed["tokens"]
    if tokens:
        # the placeholders the model makes of each medium: a model that finds them by a position mask
        # (Kosmos-2) or Whisper's encoder positions are no image/audio token ids in the prompt
        metadata["request_tokens"] = dict(tokens)
    try:
        with capture_for(model, inputs, metadata) as cap, torch.inference_mode():
            model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
    finally:
        if hook is not None:
            hook.remove()
    return cap.trace


def _pad_id(resolved: ResolvedModel) -> int:
    """generate()'s pad id: 0, except for an encoder-decoder with a pad id of its own, which gets it.
    Every token generated on meta is 0 (``argmax`` of meta logits), and Whisper's generate() strips
    trailing padding from what it made: with pad 0 it would strip every generated token and fail.
    (Greedy generation without an EOS never pads, so the id changes no memory.)"""
    pad = getattr(resolved.config, "pad_token_id", None)
    return pad if isinstance(pad, int) and pad > 0 and getattr(resolved.config, "is_encoder_decoder", False) else 0


def run_estimate(resolved: ResolvedModel, req: Request) -> tuple[Any, Any]:
    """(meta Trace, meta model) of one request, every decode step run."""
    model, inputs, tokens = _prepare(resolved, req)
    return _generate(resolved, req, model, inputs, req.new_tokens, tokens), model


def _steady_from(resolved: ResolvedModel, prompt_length: int) -> int | None:
    """Decode steps after which every step is alike; None when not known (run every step)."""
    text = resolved.config.get_text_config(decoder=True)
    layer_types = [t for t in getattr(text, "layer_types", None) or [] if t != "full_attention"]
    if not layer_types:
        return 0
    window = getattr(text, "sliding_window", None) or getattr(text, "attention_chunk_size", None)
    if set(layer_types) <= {"sliding_attention", "chunked_attention"} and isinstance(window, int):
        return max(0, window - prompt_length) + _STEADY_MARGIN
    return None


def measure(resolved: ResolvedModel, req: Request, progress: Progress = _quiet) -> tuple[Any, Any, Extrapolated | None]:
    """(meta Trace, meta model, the decode phase extrapolated to ``req.new_tokens`` or None when
    the Trace ran every step)."""
    progress("building the meta model", 0.05)
    model, inputs, tokens = _prepare(resolved, req)
    prompt = inputs["input_ids"] if "input_ids" in inputs else inputs["decoder_input_ids"]  # Whisper: the decoder's
    prompt_length = int(prompt.shape[-1])
    steady = _steady_from(resolved, prompt_length) if req.kv_dtype is None else None
    short = None if steady is None else max(_MEASURED_NEW_TOKENS, steady + 4)
    if short is not None and req.new_tokens > short + 1:
        progress(f"running {short} and {short + 1} of {req.new_tokens} new tokens", 0.2)
        first = _generate(resolved, req, model, inputs, short, tokens)
        progress(f"running {short + 1} of {req.new_tokens} new tokens", 0.5)
        longer = _generate(resolved, req, model, inputs, short + 1, tokens)
        decode = extrapolate_decode(first, longer, req.new_tokens)
        if decode is not None:
            return longer, model, decode
    progress(f"running {req.new_tokens} new tokens step by step", 0.3)
    return _generate(resolved, req, model, inputs, req.new_tokens, tokens), model, None


def versions() -> dict[str, str]:
    """The versions whose code the estimate ran."""
    import torch
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__}


def card_for(
    resolved: ResolvedModel,
    req: Request,
    device: Any = None,
    *,
    facts: bool = False,
    progress: Progress = _quiet,
) -> tuple[MemoryCard, ModelFacts | None]:
    """The card of one request (without rerun suggestions) and, with ``facts``, the model's facts;
    with a device (and facts) its verdict and arithmetic suggestions."""
    from memwarden.estimation.metamodel import model_facts

    trace, meta_model, decode = measure(resolved, req, progress)
    progress("reading the trace", 0.8)
    model_facts_ = model_facts(resolved, meta_model, req) if facts else None
    card = card_from_trace(
        trace, model=resolved.name, request=req, facts=model_facts_, device=device, decode=decode, versions=versions()
    )
    card.quantization = quantization_block(resolved, meta_model, req, card)
    if (req.images or req.videos) and not resolved.source.startswith("zoo:"):
        card.processor = "checkpoint" if resolved.processor_settings is not None else "defaults"
    return card, model_facts_


def quantization_block(resolved: ResolvedModel, model: Any, req: Request, card: MemoryCard) -> dict[str, Any] | None:
    """The card's ``quantization``: the checkpoint's method, what stayed unquantized, its transients."""
    from memwarden.estimation.metamodel import layout_for
    from memwarden.estimation.transients import method_transients

    layout = layout_for(model)
    if layout is None:
        return None
    block = layout.to_json()
    if resolved.checkpoint is not None:
        block["checkpoint_bytes"] = resolved.checkpoint.total_bytes  # every tensor of the headers, once per key
        block["checkpoint_files"] = len(resolved.checkpoint.files)
    if resolved.scheme is not None:
        elem = DTYPE_BYTES[req.dtype]
        rows = req.batch * (req.prompt_tokens + sum(card.tokens.values()) - card.tokens.get("text", 0))
        block["transients"] = method_transients(resolved.scheme, layout.largest_in_out, elem, rows)
    return block
