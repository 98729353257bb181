"""Fixed twin of unbounded-growth_llava_feature_cache_handler: the image-feature cache is a
capacity-bounded LRU (4 images); the least recently used entry is evicted when it is full.

Source: https://github.com/ai-dynamo/dynamo/pull/14452 — the encode worker's embedding dict "was
never evicted from"; the fix routes it through "the capacity-bounded LRU".
"""

import hashlib
from collections import OrderedDict

import _common as c
import torch

from memwarden.models import zoo

EXPECT = None
CAPACITY = 4

MODEL = None
_FEATURE_CACHE: OrderedDict[str, torch.Tensor] = OrderedDict()


def image_features(pixel_values: torch.Tensor) -> torch.Tensor:
    key = hashlib.sha1(pixel_values.numpy().tobytes()).hexdigest()
    if key in _FEATURE_CACHE:
        _FEATURE_CACHE.move_to_end(key)
    else:
        _FEATURE_CACHE[key] = MODEL.get_image_features(pixel_values=pixel_values).pooler_output[0]
        if len(_FEATURE_CACHE) > CAPACITY:
            _FEATURE_CACHE.popitem(last=False)
    return _FEATURE_CACHE[key]


def handle_request(image_seed: int, question_seed: int) -> list[int]:
    inputs = zoo.make_inputs(MODEL, prompt_tokens=20, seed=image_seed)
    ids = inputs["input_ids"]
    ids[0, -8:] = c.text_ids(8, MODEL.config.image_token_id, seed=question_seed)[0]
    with torch.no_grad():
        embeds = MODEL.get_input_embeddings()(ids)
        embeds[ids == MODEL.config.image_token_id] = image_features(inputs["pixel_values"])
        out = MODEL.generate(
            inputs_embeds=embeds,
            attention_mask=inputs["attention_mask"],
            max_new_tokens=2,
            **zoo.generate_kwargs("llava"),
        )
    return out[0].tolist()


def main() -> None:
    global MODEL
    torch.manual_seed(0)
    MODEL = c.llava(image_px=336, patch_px=14, hidden=256, layers=2, vocab=4096)
    for request in range(12):
        image = request if request % 4 else max(request - 1, 0)  # mostly new images, a few follow-ups
        handle_request(image, request)
    print(f"served 12 requests; cache holds {len(_FEATURE_CACHE)} images")


if __name__ == "__main__":
    main()
