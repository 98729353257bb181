"""Images a model takes through cross-attention (Mllama: Llama 3.2 Vision), built by the family's processor.

Such a model has no placeholder run to count: the prompt holds one image token per image (the
processor checks that and adds none), and the text model's cross-attention layers attend to the
vision states of every tile, through a ``(B, T, images, tiles)`` ``cross_attention_mask`` that the
processor builds from where the image tokens sit and how many tiles each image was cut into.

Nothing of it is written here: the family's own processor class (transformers' auto mapping) is
run on the request. Its tokenizer is a word-level one made in memory whose every word is one
token id (``<128256>``), so the request's ids pass through the processor's own text handling
unchanged, and its image processor is the one :func:`memwarden.estimation.request.image_processor`
builds from the config (tile side, ``max_num_tiles``). It runs once, on one row of blank images of
the requested sizes, without its elementwise rescale/normalize steps; the batch repeats that row.
The pixels go to the meta device; the ids, masks and aspect-ratio ids stay real, as generate()
extends ``cross_attention_mask`` by a row per decoded token on the host.
"""

from __future__ import annotations

import inspect
from typing import Any

from memwarden.errors import InputError
from memwarden.estimation.request_media import processor_class

__all__ = ["cross_attention_request", "takes_cross_attention_images"]

_SHAPE_ONLY = {"do_rescale": False, "do_normalize": False}  # elementwise: no shape or mask depends on them


def takes_cross_attention_images(model: Any) -> bool:
    """Whether ``model`` takes images as cross-attention states rather than as placeholder tokens."""
    encode = getattr(model, "get_image_features", None) or getattr(
        getattr(model, "model", None), "get_image_features", None
    )
    return encode is None and "cross_attention_mask" in inspect.signature(model.forward).parameters


def _word(token_id: int) -> str:
    return f"<{token_id}>"


def _id_tokenizer(ids: list[int], bos: int | None, image_id: int) -> Any:
    """A fast tokenizer whose words are token ids: ``"<5> <128256>"`` -> [5, 128256], nothing added."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    known = {*ids, image_id, *([bos] if bos is not None else [])}
    words = Tokenizer(models.WordLevel({_word(i): i for i in known}))  # no unknown word: every id is one
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    specials: dict[str, Any] = {"extra_special_tokens": {"image_token": _word(image_id)}}
    if bos is not None:
        specials["bos_token"] = _word(bos)
    return PreTrainedTokenizerFast(tokenizer_object=words, **specials)


def cross_attention_request(
    config: Any,
    image_processor: Any,
    ids: list[int],
    images: list[tuple[int, int]],
    batch: int,
    tokens: tuple[int | None, int],
) -> dict[str, Any]:
    """The processor's inputs for ``batch`` rows of the prompt ``ids`` (one image token per image)
    and blank images of the given (W, H): input_ids, attention_mask, cross_attention_mask and the
    aspect-ratio tensors real, pixel_values on meta. ``tokens``: the (BOS, image token) ids."""
    import numpy as np
    import torch

    cls = processor_class(config)
    family = config.model_type
    if cls is None:
        raise InputError(f"transformers has no processor for model_type {family!r}; send a text-only request")
    bos, image_id = tokens
    try:
        processor = cls(image_processor=image_processor, tokenizer=_id_tokenizer(ids, bos, image_id))
    except (TypeError, ValueError) as exc:  # a processor that needs more than an image processor and a tokenizer
        raise InputError(
            f"{cls.__name__} cannot be built without the checkpoint's files ({exc}); send a text-only request"
        ) from exc
    blanks = [np.zeros((h, w, 3), dtype=np.uint8) for w, h in images]
    text = " ".join(_word(i) for i in ids)
    out = dict(processor(text=[text], images=[blanks], return_tensors="pt", **_SHAPE_ONLY).items())
    got = out["input_ids"][0].tolist()
    if got.count(image_id) != len(images):  # a processor that expands image tokens is no cross-attention one
        raise InputError(
            f"{cls.__name__} made {got.count(image_id)} image tokens of {len(images)} images, so the model does not "
            "take them through cross-attention alone; send a text-only request"
        )
    request: dict[str, Any] = {}
    for key, value in out.items():
        if not isinstance(value, torch.Tensor):
            continue
        if value.is_floating_point():  # (1, images, tiles, C, H, W): only the shape is used
            request[key] = torch.empty((batch, *value.shape[1:]), dtype=value.dtype, device="meta")
        else:
            request[key] = value.repeat(batch, *([1] * (value.dim() - 1)))
    return request
