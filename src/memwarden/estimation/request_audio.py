"""Audio requests: the model's audio inputs built by its own feature extractor on a silent clip of
the request's length, and the tokens they make — placeholders in the prompt for an audio tower that
feeds the language model (Qwen2-Audio, Qwen2.5-Omni), or the encoder's positions for an
encoder-decoder speech model that is its own audio encoder (Whisper)."""

from __future__ import annotations

import inspect
import math
from typing import Any

from memwarden.errors import InputError
from memwarden.estimation.request_media import (
    MAX_AUDIO_SECONDS,
    MAX_WAVEFORM_SAMPLES,
    encoder_of,
    feature_tokens,
    first_class,
    in_model_dtype,
    media_tokens,
    processor_defaults,
)

__all__ = ["audio_media"]


def audio_media(model: Any, config: Any, seconds: float, batch: int) -> tuple[dict[str, Any], int]:
    """(the model's audio inputs on meta for ``batch`` rows, placeholder tokens per row)."""
    import numpy as np
    import torch
    from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES

    family = config.model_type
    if not 0 < seconds <= MAX_AUDIO_SECONDS:
        raise InputError(f"audio_seconds must be in (0, {MAX_AUDIO_SECONDS:g}]; got {seconds!r}")
    cls = first_class(FEATURE_EXTRACTOR_MAPPING_NAMES, config)
    # An encoder-decoder speech model (Whisper) is its own audio encoder: the audio goes to its encoder,
    # whose config is the model's, and the prompt holds no placeholders (it is the decoder's)
    speech = _speech_encoder_decoder(model, config)
    ac = config if speech else getattr(config, "audio_config", None)
    if cls is None or ac is None:
        raise InputError(f"model_type {family!r} has no audio encoder and feature extractor in transformers")
    kwargs: dict[str, Any] = {}
    mel = getattr(ac, "num_mel_bins", None)
    if isinstance(mel, int) and "feature_size" in inspect.signature(cls.__init__).parameters:
        kwargs["feature_size"] = mel
    if not speech:
        encoder_of(model, "get_audio_features")  # before anything is built: Phi-4-multimodal has none
    extractor = cls(**kwargs)
    rate = int(extractor.sampling_rate)
    defaults = processor_defaults(config, "audio")
    window = defaults.pop("max_source_positions", None)
    multiple = defaults.get("pad_to_multiple_of")
    accepted = inspect.signature(extractor.__call__).parameters
    call = {k: v for k, v in defaults.items() if k in accepted and k not in ("return_tensors", "sampling_rate")}
    samples = max(1, round(seconds * rate))
    chunks = 1
    if isinstance(window, int) and isinstance(multiple, int) and multiple > 0:
        chunks, samples = math.ceil(samples / multiple), multiple  # one window run; the rest is arithmetic
    elif samples > MAX_WAVEFORM_SAMPLES:  # the processor takes the clip whole: its silence is real memory
        raise InputError(
            f"model_type {family!r} takes an audio clip whole; at most {MAX_WAVEFORM_SAMPLES // rate} s here"
        )
    out = extractor(np.zeros(samples, dtype=np.float32), sampling_rate=rate, return_tensors="pt", **call)
    features = out.get("input_features")  # (1, mel, frames)
    if not isinstance(features, torch.Tensor):
        raise InputError(f"model_type {family!r}: its feature extractor gives no input_features; send no audio")
    if isinstance(window, int):
        features = features.reshape(extractor.feature_size, -1, window).transpose(0, 1)  # (chunks, mel, window)
    shape = (features.shape[0] * chunks, *features.shape[1:])
    media = {"input_features": torch.empty(shape, dtype=features.dtype, device="meta")}
    mask = out.get("attention_mask")  # (1, frames): which frames are the clip, which padding
    if isinstance(mask, torch.Tensor) and chunks == 1:
        # a processor that asks for the mask hands it to the model (Qwen2.5-Omni: feature_attention_mask),
        # whose audio tower then runs on the clip's frames only
        media["feature_attention_mask"] = mask
    tokens = _encoder_positions(model, media) if speech else media_tokens(model, "get_audio_features", media)
    media["input_features"] = torch.empty((shape[0] * batch, *shape[1:]), dtype=features.dtype, device="meta")
    if "feature_attention_mask" in media:
        media["feature_attention_mask"] = mask.repeat(batch, 1)
    return media, tokens


def _speech_encoder_decoder(model: Any, config: Any) -> bool:
    """Whether ``model`` is an encoder-decoder whose encoder takes the audio features (Whisper)."""
    return (
        bool(getattr(config, "is_encoder_decoder", False)) and getattr(model, "main_input_name", "") == "input_features"
    )


def _encoder_positions(model: Any, media: dict[str, Any]) -> int:
    """The positions the encoder makes of the features (Whisper: 3000 mel frames -> 1500), on meta:
    the length of the states the decoder cross-attends to."""
    import torch

    from memwarden.record.meta.capture import placement

    encoder = model.get_encoder()
    with placement(), torch.inference_mode():
        out = encoder(input_features=in_model_dtype(model, media)["input_features"], return_dict=True)
    return feature_tokens(out)
