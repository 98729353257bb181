"""issue 44: the families ``estimate`` refused (BLIP-2 and InstructBLIP's Q-Former, Kosmos-2's position
mask, Fuyu's patches straight into the decoder, Whisper's encoder-decoder audio) estimate from their
shipped configs: the weights within 5% of the published checkpoint's (the Hub's safetensors parameter
count x the bytes of the dtype it is stored in), and the media tokens as each family's processor and
model make them. Meta runs only: no weights, small requests."""

from __future__ import annotations

import pytest

from memwarden.errors import InputError
from memwarden.estimation.metamodel import model_for
from memwarden.estimation.resolve import resolve_model
from memwarden.estimation.run import estimate

# Hub id -> (published parameters, bytes per parameter as stored). The Hub's "Model size" of each
# checkpoint's safetensors (its file sizes agree: blip2-opt-2.7b 15.5 GB in float32, instructblip
# 31.7 GB = 9.9 + 9.96 + 9.92 + 1.88 GB in float32, kosmos-2 model.safetensors 6.66 GB in float32,
# fuyu-8b 18.8 GB = 9.96 + 8.86 GB in bfloat16, whisper-small 967 MB in float32); sources in
# memwarden/models/configs/README.md.
PUBLISHED = {
    "Salesforce/blip2-opt-2.7b": (3.87e9, 4),  # its files hold OPT's tied head twice; loaded once
    "Salesforce/instructblip-vicuna-7b": (7.91e9, 4),
    "microsoft/kosmos-2-patch14-224": (1.66e9, 4),
    "adept/fuyu-8b": (9.41e9, 2),
    "openai/whisper-small": (242e6, 4),
}


def _weights_bytes(hub_id: str) -> int:
    resolved = resolve_model(hub_id)
    model = model_for(resolved, resolved.default_dtype, None)
    return sum({id(t): t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]}.values())


@pytest.mark.parametrize("hub_id", list(PUBLISHED))
def test_weights_within_5_percent_of_the_published_checkpoint(hub_id: str) -> None:
    parameters, elem = PUBLISHED[hub_id]
    published = parameters * elem
    estimated = _weights_bytes(hub_id)
    assert abs(estimated - published) <= 0.05 * published, (hub_id, estimated, published)


# (Hub id, request, media tokens the card counts per sequence)
MEDIA = [
    ("Salesforce/blip2-opt-2.7b", {"images": [(640, 480)]}, {"vision": 32}),  # the Q-Former's 32 queries
    ("Salesforce/blip2-opt-2.7b", {"images": [(1920, 1080)]}, {"vision": 32}),  # whatever the image size
    ("Salesforce/instructblip-vicuna-7b", {"images": [(640, 480)]}, {"vision": 32}),
    ("microsoft/kosmos-2-patch14-224", {"images": [(640, 480)]}, {"vision": 64}),  # 64 latent queries
    # 640x480 is not resized (never up): 16 rows of 22 patches of 30x30 px, each row ended by a newline
    ("adept/fuyu-8b", {"images": [(640, 480)]}, {"vision": 16 * (22 + 1)}),
    # 1920x1080 is the processor's size: 36 rows of 64 patches
    ("adept/fuyu-8b", {"images": [(1920, 1080)]}, {"vision": 36 * (64 + 1)}),
    # one 30 s window of 3000 mel frames -> 1500 encoder positions, also for a shorter clip
    ("openai/whisper-small", {"audio_seconds": 10.0}, {"audio": 1500}),
]


@pytest.mark.parametrize(("hub_id", "request_", "tokens"), MEDIA)
def test_media_tokens_as_the_family_makes_them(hub_id: str, request_: dict, tokens: dict) -> None:
    card = estimate(hub_id, prompt_tokens=8, new_tokens=2, suggest=False, **request_)
    assert {k: card.tokens[k] for k in tokens} == tokens
    assert card.tokens["text"] == 8
    # the decoding part's calls are the steps: prefill and decode phases, the KV cache at the end
    assert {"prefill", "decode"} <= set(card.phases)
    assert card.kv_cache_bytes > 0
    assert card.weights_bytes == _weights_bytes(hub_id)


def test_whisper_keeps_the_cross_attention_cache() -> None:
    """The decoder's cross-attention cache holds the 1500 encoder positions in every layer:
    12 layers x (K, V) x 1500 x 768 x 4 bytes, beside a few tokens of self-attention cache."""
    card = estimate("openai/whisper-small", audio_seconds=5.0, prompt_tokens=4, new_tokens=2, suggest=False)
    cross = 12 * 2 * 1500 * 768 * 4
    assert cross <= card.kv_cache_bytes <= cross + 12 * 2 * 8 * 768 * 4


@pytest.mark.parametrize(
    ("hub_id", "needs"),
    [("Salesforce/blip2-opt-2.7b", "an image"), ("openai/whisper-small", "audio")],
)
def test_a_model_that_generates_only_from_a_medium_refuses_a_request_without_it(hub_id: str, needs: str) -> None:
    with pytest.raises(InputError, match=f"generates only from {needs}"):
        estimate(hub_id, prompt_tokens=8, new_tokens=2, suggest=False)


def test_kosmos_2_answers_a_text_only_request() -> None:
    """Kosmos-2's generate() takes no image as well (its text model generates alone)."""
    card = estimate("microsoft/kosmos-2-patch14-224", prompt_tokens=8, new_tokens=2, suggest=False)
    assert card.tokens["vision"] == 0 and card.kv_cache_bytes > 0
