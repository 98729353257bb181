"""The request of any transformers config, built from the model itself: no per-family token table.

- Images go through the family's own image processor class (transformers' auto mapping, the PIL
  backend: no torchvision needed), constructed from its defaults plus the sizes the config
  states (vision ``image_size``, ``patch_size``, ``spatial_merge_size``, ``image_grid_pinpoints``,
  tile counts), or from the checkpoint folder's own ``preprocessor_config.json`` where it ships
  one (:mod:`memwarden.estimation.processor_file`), so tiling, splitting and pixel limits are exactly
  the processor's. It runs on a
  blank uint8 image of the requested size (sizes are checked first) without its elementwise
  rescale/normalize steps, once per (processor settings, sizes), and only the shapes and dtypes
  of its float outputs are kept: they go to the meta device
  (:func:`memwarden.estimation.request_media.processed`).
- The placeholder count of an image is what the model's own ``get_image_features`` returns for
  that processor output, run on the meta model (so it includes tiles, newline tokens, pooling),
  kept by value (model class and config, processor settings, size).
- A model that takes images through cross-attention (Mllama) has no placeholders: the prompt
  holds one image token per image, and the family's processor makes the tiles, aspect-ratio ids
  and ``cross_attention_mask`` of the request's ids (:mod:`memwarden.estimation.request_cross`).
- Float inputs go to the model in its dtype, as ``processor(...).to(model.dtype)`` sends them.
- Videos and audio (any family's, through its video processor's defaults and its feature
  extractor) are built in :mod:`memwarden.estimation.request_media`; the same model call counts them.
- Models that place images otherwise are built from the same model code: an instruction-aware
  Q-Former (InstructBLIP) also gets the prompt in its own vocabulary (:func:`encoder_prompt`); a
  model that finds the image by a position mask (Kosmos-2's ``image_embeds_position_mask``) gets
  the mask where the placeholders sit; an image processor that cuts patches for the decoder itself
  (Fuyu: no vision tower) gives the patches, and each row of them ends with a newline token, as its
  processor writes them (:func:`memwarden.estimation.request_media.patch_stream`).
- An encoder-decoder (Whisper) takes the prompt as ``decoder_input_ids`` from its decoder start
  token; its audio goes to the encoder, whose positions are counted as audio tokens but are no
  placeholders in the prompt.
- Text is ids below the lowest special id; markers (BOS, image start/end, row/column tokens)
  are ordinary text tokens and count towards ``prompt_tokens``. A BOS that does not fit beside
  the media markers is left out (Qwen's templates send none).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any

from memwarden.errors import InputError
from memwarden.estimation.prompt_ids import (
    FIRST_TEXT_ID,
    context_of,
    encoder_prompt,
    image_token_id,
    media_markers,
    placeholder_id,
    special_ids,
    takes_position_mask,
)
from memwarden.estimation.request_audio import audio_media
from memwarden.estimation.request_cross import cross_attention_request, takes_cross_attention_images
from memwarden.estimation.request_media import (
    feature_tokens,
    in_model_dtype,
    patch_stream,
    processed,
    processing_families,
    processor_key,
    video_media,
)

__all__ = ["MAX_IMAGE_PIXELS", "build_request", "image_processor", "placeholder_counts"]

MAX_IMAGE_PIXELS = 64 * 1024**2  # 8192 x 8192: larger than any camera image a processor is fed
_MAX_PATCHES_PER_IMAGE = 1 << 18  # 4x Qwen2-VL's largest (3584^2 / 14^2); beyond it a config is broken
_MAX_PROCESSOR_SIDE = 1 << 12  # a fixed-size processor's side; real ones are at most 1540 (Mistral 3)
# (model class, its config, processor settings, (W, H)) -> placeholder tokens of that image
_COUNTS: OrderedDict[tuple[Any, ...], int] = OrderedDict()
# the same for a prompt's images counted together: every (W, H) -> each image's tokens
_JOINT_COUNTS: OrderedDict[tuple[Any, ...], tuple[int, ...]] = OrderedDict()
_COUNTS_KEPT = 256


def _vision(config: Any) -> Any:
    """The image encoder's config: a vision tower's, else a VQ image tokenizer's (Chameleon, Emu3)."""
    return getattr(config, "vision_config", None) or getattr(config, "vq_config", None)


def _image_side(vc: Any) -> int | None:
    """The side the encoder takes: a tower's ``image_size``, a VQ encoder's ``resolution`` (Chameleon's 512)."""
    side = getattr(vc, "image_size", None) or getattr(vc, "resolution", None)
    if isinstance(side, (list, tuple)) and side:
        side = side[0]
    return int(side) if isinstance(side, int) and not isinstance(side, bool) else None


def _size_dict(value: Any) -> dict[str, Any]:
    """A processor's size (a dict or transformers' SizeDict) as a dict of the keys it sets."""
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if v is not None}
    fields = getattr(value, "__dataclass_fields__", None)
    return {k: getattr(value, k) for k in fields if getattr(value, k) is not None} if fields else {}


def _pixel_limited(proc: Any, max_pixels: int) -> dict[str, Any]:
    """A dynamic-resolution processor's size with ``max_pixels`` as its pixel budget (Qwen2-VL's
    max_pixels is the size's longest_edge, min_pixels its shortest_edge)."""
    if not hasattr(proc, "merge_size"):
        raise InputError(
            f"max_pixels applies to dynamic-resolution processors; {type(proc).__name__} resizes to a size"
        )
    return {**_size_dict(getattr(proc, "size", None)), "longest_edge": max_pixels}


def _processor_kwargs(cls: Any, config: Any, max_pixels: int | None) -> dict[str, Any]:
    """Sizes the config states, given to the processor under the names the processor uses."""
    proc = cls()
    vc = _vision(config)
    side = _image_side(vc) if vc is not None else None
    patch = getattr(vc, "patch_size", None)
    kw: dict[str, Any] = {}
    merge = getattr(vc, "spatial_merge_size", None)
    if hasattr(proc, "merge_size") and isinstance(merge, int):
        kw["merge_size"] = merge
    if hasattr(proc, "temporal_patch_size") and isinstance(getattr(vc, "temporal_patch_size", None), int):
        kw["temporal_patch_size"] = vc.temporal_patch_size
    if isinstance(getattr(proc, "patch_size", None), int) and isinstance(patch, int):
        kw["patch_size"] = patch
    pinpoints = getattr(config, "image_grid_pinpoints", None)
    if hasattr(proc, "image_grid_pinpoints") and pinpoints:
        kw["image_grid_pinpoints"] = pinpoints
    tiles = getattr(vc, "max_num_tiles", None)
    if hasattr(proc, "max_image_tiles") and isinstance(tiles, int):
        kw["max_image_tiles"] = tiles
    dynamic = hasattr(proc, "merge_size")  # Qwen-style: size is a pixel budget, not a side
    size = _size_dict(getattr(proc, "size", None))
    if max_pixels is not None:
        kw["size"] = size = _pixel_limited(proc, max_pixels)
    if side is not None and not dynamic:
        max_image = _size_dict(getattr(proc, "max_image_size", None))
        if max_image.get("longest_edge"):  # Idefics3 / SmolVLM: tiles of max_image_size, whole image <= size
            scale = side / max_image["longest_edge"]
            kw["max_image_size"] = {"longest_edge": side}
            if size.get("longest_edge"):
                kw["size"] = {"longest_edge": round(size["longest_edge"] * scale)}
        elif "shortest_edge" in size and "longest_edge" in size:  # Idefics2: longest side = the tower's
            scale = side / size["longest_edge"]
            kw["size"] = {"shortest_edge": round(size["shortest_edge"] * scale), "longest_edge": side}
        elif "height" in size and "width" in size:
            kw["size"] = {"height": side, "width": side}
        elif "shortest_edge" in size:
            kw["size"] = {"shortest_edge": side}
        elif "longest_edge" in size:
            kw["size"] = {"longest_edge": side}
        crop = _size_dict(getattr(proc, "crop_size", None))
        if "height" in crop:
            kw["crop_size"] = {"height": side, "width": side}
    return kw


def _from_settings(cls: Any, settings: dict[str, Any], max_pixels: int | None) -> Any:
    """``cls`` with a checkpoint folder's own settings (as ``from_pretrained`` would read them),
    ``max_pixels`` over them; the sides of a fixed-size processor bounded."""
    try:
        proc = cls.from_dict(dict(settings))
        if max_pixels is not None:
            legacy = ("min_pixels", "max_pixels")  # older files' names for the size's two bounds
            unlimited = {k: v for k, v in settings.items() if k not in legacy}
            proc = cls.from_dict({**unlimited, "size": _pixel_limited(proc, max_pixels)})
    except InputError:
        raise
    except Exception as exc:  # values the class rejects
        raise InputError(
            f"the checkpoint's processor settings do not build {cls.__name__} "
            f"({exc.__class__.__name__}: {str(exc)[:200]})"
        ) from None
    if not hasattr(proc, "merge_size"):  # a fixed-size processor: its sides bounded
        for attr in ("size", "crop_size", "max_image_size"):
            sides = [v for v in _size_dict(getattr(proc, attr, None)).values() if isinstance(v, int)]
            if any(not 1 <= v <= _MAX_PROCESSOR_SIDE for v in sides):
                raise InputError(
                    f"the checkpoint's processor resizes to {attr} = {_size_dict(getattr(proc, attr))}; "
                    f"no real processor's side is outside 1..{_MAX_PROCESSOR_SIDE} px"
                )
    return proc


def image_processor(
    family: str, config: Any, max_pixels: int | None = None, settings: dict[str, Any] | None = None
) -> Any:
    """The family's image processor (PIL backend) for ``config``; InputError when transformers has none.

    ``settings``: a checkpoint folder's own (``preprocessor_config.json``), used as they are instead of
    the sizes memwarden derives from the config (the class is still the family's)."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    backends: set[str] = set()
    for served in processing_families(config):  # a variant's own type, then the family it is served by
        names = IMAGE_PROCESSOR_MAPPING_NAMES.get(served) or {}
        if not isinstance(names, dict):
            continue
        backends |= {b for b, n in names.items() if n}
        for backend in ("pil", *sorted(b for b in names if b != "pil")):  # PIL first: no torchvision needed
            name = names.get(backend)
            try:
                cls = getattr(transformers, name, None) if isinstance(name, str) else None
            except ImportError:
                cls = None
            # without its backend installed the class is a placeholder that is no BaseImageProcessor
            if isinstance(cls, type) and issubclass(cls, transformers.image_processing_utils.BaseImageProcessor):
                if settings is not None:
                    return _from_settings(cls, settings, max_pixels)
                return cls(**_processor_kwargs(cls, config, max_pixels))
    if backends:  # only a torchvision processor (Llama 4, LFM2-VL, Phi-4-multimodal, Cohere2-Vision)
        raise InputError(
            f"model_type {family!r}: transformers' image processor for it needs {' or '.join(sorted(backends))}, "
            "which is not installed (pip install torchvision); or send a text-only request"
        )
    raise InputError(f"transformers has no image processor for model_type {family!r}; send a text-only request")


def _check_image(config: Any, wh: tuple[int, int]) -> None:
    w, h = wh
    if w * h > MAX_IMAGE_PIXELS:
        raise InputError(f"an image of {w}x{h} px is over {MAX_IMAGE_PIXELS // 1024**2} MPx; no processor takes it")
    vc = _vision(config)
    patch = getattr(vc, "patch_size", None)
    if isinstance(patch, int) and patch > 0:
        side = _image_side(vc) or max(w, h)
        patches = max(w * h, side * side) // (patch * patch)
        if patches > _MAX_PATCHES_PER_IMAGE:
            raise InputError(
                f"vision patch_size = {patch} makes {patches} patches per image (limit {_MAX_PATCHES_PER_IMAGE}); "
                "the config is not a real model's"
            )


def _accepted(fn: Any, values: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    return {k: v for k, v in values.items() if k in params}


def _to_meta(values: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {
        k: (torch.empty_like(v, device="meta") if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
        for k, v in values.items()
    }


def placeholder_counts(
    model: Any, processor: Any, images: list[tuple[int, int]], prompt: dict[str, Any] | None = None
) -> list[int]:
    """Tokens the model's ``get_image_features`` makes of each image, run on the meta model.
    ``prompt``: what the image encoder reads of the prompt besides the pixels (:func:`encoder_prompt`)."""
    import torch

    from memwarden.record.meta.capture import placement

    encode = getattr(model, "get_image_features", None) or getattr(
        getattr(model, "model", None), "get_image_features", None
    )
    if encode is None:
        if takes_cross_attention_images(model):  # Mllama: its tiles are cross-attention states, not tokens
            raise InputError(f"{type(model).__name__} takes images through cross-attention: no placeholders to count")
        raise InputError(
            f"{type(model).__name__} has no get_image_features, by which memwarden counts an image's tokens; "
            "send a text-only request"
        )
    # The count depends on the model's code and config, the processor's settings and the size only:
    # kept by those values, so the points of a --fit search or a sweep that share an image run it once.
    model_key = (f"{type(model).__module__}.{type(model).__qualname__}", model.config.to_json_string())
    if len(images) > 1:
        together = _counted_together(model, processor, images, prompt, encode, model_key)
        if together is not None:
            return together
    counts = []
    for wh in images:
        key = (*model_key, processor_key(processor), tuple(wh))
        count = _COUNTS.get(key)
        if count is None:
            media = in_model_dtype(model, {**_to_meta(processed(processor, [wh], 1)), **_rows(prompt or {}, 1)})
            with placement(), torch.inference_mode():
                out = encode(**_accepted(encode, media), return_dict=True)
            _check_width(model.config, out)
            count = _COUNTS[key] = feature_tokens(out)
            while len(_COUNTS) > _COUNTS_KEPT:
                _COUNTS.popitem(last=False)
        _COUNTS.move_to_end(key)
        counts.append(count)
    return counts


def _counted_together(
    model: Any, processor: Any, images: list[tuple[int, int]], prompt: dict[str, Any] | None, encode: Any, key: Any
) -> list[int] | None:
    """Each image's tokens where the processor takes a prompt's images together (``batch_num_images``):
    LLaVA-OneVision tiles a lone image (1485 tokens at 384 px) but gives each of several only its base
    view (730), as its model does; counted one by one, two made 2970 placeholders for 1460 features."""
    import torch

    from memwarden.record.meta.capture import placement

    joint = processed(processor, images, 1)
    key = (*key, processor_key(processor), tuple(images))
    if "batch_num_images" in joint and key not in _JOINT_COUNTS:
        media = in_model_dtype(model, {**_to_meta(joint), **_rows(prompt or {}, 1)})
        with placement(), torch.inference_mode():
            out = encode(**_accepted(encode, media), return_dict=True)
        _check_width(model.config, out)
        parts = getattr(out, "pooler_output", None)
        if parts is None or isinstance(parts, torch.Tensor) or len(parts) != len(images):
            return None  # not told apart per image: counted one by one
        _JOINT_COUNTS[key] = tuple(int(p.numel() // max(p.shape[-1], 1)) for p in parts)
        while len(_JOINT_COUNTS) > _COUNTS_KEPT:
            _JOINT_COUNTS.popitem(last=False)
    if key not in _JOINT_COUNTS:
        return None
    _JOINT_COUNTS.move_to_end(key)
    return list(_JOINT_COUNTS[key])


def _check_width(config: Any, output: Any) -> None:
    """The image features must be as wide as the text model's embeddings, which they replace:
    otherwise transformers fails later with a count mismatch that names equal counts (a config whose
    vision ``out_hidden_size`` is not its text ``hidden_size``, as Qwen3-VL-MoE's class defaults)."""
    import torch

    hidden = getattr(config.get_text_config(), "hidden_size", None)
    features = getattr(output, "pooler_output", None)
    if features is None or not isinstance(hidden, int):
        return
    parts = [features] if isinstance(features, torch.Tensor) else list(features)
    widths = {int(p.shape[-1]) for p in parts if isinstance(p, torch.Tensor) and p.dim() > 0}
    if widths and widths != {hidden}:
        raise InputError(
            f"model_type {config.model_type!r}: its image features are {'/'.join(map(str, sorted(widths)))} wide but "
            f"the text model's embeddings are {hidden} (vision out_hidden_size vs text hidden_size); "
            "the config is not a real model's"
        )


def _check_patch_count(model: Any, patches: Any, grids: list[tuple[int, int]]) -> None:
    """The decoder's own patch embedding (``get_image_features``, on meta) makes one token per patch."""
    import torch

    from memwarden.record.meta.capture import placement

    encode = getattr(model, "get_image_features", None) or getattr(
        getattr(model, "model", None), "get_image_features", None
    )
    if encode is None:
        raise InputError(f"{type(model).__name__} has no get_image_features; send a text-only request")
    with placement(), torch.inference_mode():
        out = encode(pixel_values=in_model_dtype(model, {"p": patches})["p"], return_dict=True)
    made, cut = feature_tokens(out), sum(r * c for r, c in grids)
    if made != cut:
        raise InputError(f"{type(model).__name__} makes {made} tokens of {cut} patches; send a text-only request")


def _rows(values: dict[str, Any], batch: int) -> dict[str, Any]:
    """The first ``batch`` rows of each (B, T) tensor."""
    return {k: v[:batch] for k, v in values.items()}


def build_request(
    model: Any,
    config: Any,
    *,
    images: tuple[tuple[int, int], ...],
    prompt_tokens: int,
    new_tokens: int,
    batch: int,
    max_pixels: int | None = None,
    videos: tuple[tuple[int, int, int], ...] = (),
    audio_seconds: float | None = None,
    processor_settings: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, int]]:
    """(generate() inputs with float tensors on meta, token counts per sequence). ``videos``: (W, H,
    frames) each; ``audio_seconds``: one clip, through the family's feature extractor;
    ``processor_settings``: the checkpoint folder's image processor settings, when it ships them."""
    import torch

    text = config.get_text_config()
    context = context_of(config)
    runs: list[tuple[str, int]] = []  # (kind, placeholders) in prompt order: images, videos, audio
    # placeholders per row of an image whose every row of patches the processor ends with a newline token
    row_widths: dict[int, int] = {}
    encoded = 0  # audio positions an encoder-decoder's decoder cross-attends to (not in its prompt)
    media: dict[str, Any] = {}
    cross = bool(images) and takes_cross_attention_images(model)
    if images:
        for wh in images:
            _check_image(config, wh)
        processor = image_processor(config.model_type, config, max_pixels, processor_settings)
        stream = None if cross else patch_stream(processor, list(images))
        if cross:  # the prompt's one image token per image; the processor builds the rest from the ids
            runs += [("image", 1) for _ in images]
        elif stream is not None:  # Fuyu: the patches are the tokens, each row ended by a newline token
            patches, grids = stream
            _check_patch_count(model, patches, grids)
            for rows, cols in grids:
                row_widths[len(runs)] = cols
                runs.append(("image", rows * (cols + 1)))
            media = {"pixel_values": torch.empty((batch, *patches.shape[1:]), dtype=patches.dtype, device="meta")}
        else:
            n_text = max(prompt_tokens - 2, 1)
            prompt = encoder_prompt(model, config, n_text, batch)
            runs += [("image", n) for n in placeholder_counts(model, processor, list(images), prompt)]
            media = {**_to_meta(processed(processor, list(images), batch)), **prompt}
    if videos:
        for w, h, _frames in videos:
            _check_image(config, (w, h))
        frames = image_processor(config.model_type, config, max_pixels, processor_settings)
        video_inputs, video_counts = video_media(model, config, videos, batch, max_pixels, frames)
        media.update(video_inputs)
        runs += [("video", n) for n in video_counts]
    if audio_seconds is not None:
        audio_inputs, audio_count = audio_media(model, config, audio_seconds, batch)
        media.update(audio_inputs)
        if getattr(config, "is_encoder_decoder", False):  # Whisper: the encoder's positions, no placeholders
            encoded = audio_count
        else:
            runs.append(("audio", audio_count))
    placeholders = sum(n for _, n in runs)
    total = prompt_tokens + placeholders
    if isinstance(context, int) and total + new_tokens > context:
        raise InputError(
            f"{total} prompt tokens ({placeholders} image/video/audio) + {new_tokens} new tokens exceed the "
            f"model's context of {context} (max_position_embeddings)"
        )
    bos = getattr(text, "bos_token_id", None)
    # A speech encoder-decoder (Whisper) is its own audio encoder: the prompt is its decoder's. An
    # encoder-decoder whose encoder reads the prompt (Florence-2: image features merged into it) keeps it.
    speech = getattr(config, "is_encoder_decoder", False) and getattr(model, "main_input_name", "") == "input_features"
    if speech:  # the decoder's prompt opens with its start token
        bos = getattr(config, "decoder_start_token_id", None)
    lead = [bos] if isinstance(bos, int) and 0 <= bos < text.vocab_size else []
    specials = [i for i in special_ids(config) if i >= FIRST_TEXT_ID]
    top = min([text.vocab_size, *specials])
    if top <= FIRST_TEXT_ID:
        raise InputError(f"model_type {config.model_type!r}: no ordinary text ids below its special tokens")
    markers = {kind: media_markers(config, kind) for kind in {k for k, _ in runs}}
    n_wrap = sum(len(markers[kind][0]) + len(markers[kind][1]) for kind, _ in runs)
    if prompt_tokens < len(lead) + n_wrap:
        lead = []  # BOS is an ordinary text token here (Qwen's templates send none): the media markers first
    n_markers = len(lead) + n_wrap
    if prompt_tokens < n_markers:
        raise InputError(
            f"model_type {config.model_type!r} needs prompt_tokens >= {n_markers} for {len(runs)} image(s)/video(s) "
            f"(their begin/end markers); got {prompt_tokens}"
        )
    n_text = prompt_tokens - n_markers
    words = (torch.arange(n_text, dtype=torch.long) % (top - FIRST_TEXT_ID) + FIRST_TEXT_ID).tolist()
    ids = list(lead)
    positions: list[int] = []  # where image placeholders sit (a position-mask model's mask)
    for i, (kind, n) in enumerate(runs):
        opening, closing = markers[kind]
        ids += opening
        token = placeholder_id(model, config, kind)
        width = row_widths.get(i)
        for _row in range(0, n, (width + 1) if width else max(n, 1)):
            per_row = width if width else n
            if kind == "image":
                positions += range(len(ids), len(ids) + per_row)
            ids += [token] * per_row + ([FIRST_TEXT_ID] if width else [])  # the row's newline: a text embedding
        ids += closing
        # Models that find media as runs of placeholders (Qwen-VL's rope index) need a text token
        # between two of them, as every chat template puts one.
        if i + 1 < len(runs) and words:
            ids.append(words.pop())
    ids += words
    input_ids = torch.tensor([ids] * batch, dtype=torch.long)
    inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    if images and not cross and takes_position_mask(model) and "image_embeds_position_mask" not in media:
        mask = torch.zeros_like(input_ids)
        mask[:, positions] = 1
        media["image_embeds_position_mask"] = mask
    if cross:
        known_bos = bos if isinstance(bos, int) and 0 <= bos < text.vocab_size else None
        media = cross_attention_request(
            config, processor, ids, list(images), batch, (known_bos, image_token_id(config))
        )
    accepted = inspect.signature(model.forward).parameters
    inputs.update(in_model_dtype(model, {k: v for k, v in media.items() if k in accepted}))
    if speech and "decoder_input_ids" in accepted:
        # the prompt is the decoder's (Whisper's task tokens and text); the encoder takes the media, and
        # generate() reads ``attention_mask`` as the media's mask
        inputs = {
            "decoder_input_ids": inputs["input_ids"],
            **{k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")},
        }
    if runs and "mm_token_type_ids" in accepted:
        kinds = {"image": 1, "video": 2, "audio": 3}
        type_ids = torch.zeros_like(input_ids, dtype=torch.int)
        for kind in {k for k, _ in runs}:
            type_ids[input_ids == placeholder_id(model, config, kind)] = kinds[
                kind
            ]  # Qwen-VL: text 0, image 1, video 2
        inputs["mm_token_type_ids"] = type_ids
    count = {kind: sum(n for k, n in runs if k == kind) for kind in ("image", "video", "audio")}
    tokens = {"vision": count["image"] + count["video"], "audio": count["audio"] + encoded, "text": prompt_tokens}
    return inputs, tokens
