"""A VQA endpoint on a LLaVA-style model that caches each image's projected features by image hash
in a module-level dict, so follow-up questions on the same image skip the vision tower — the dict
is never evicted, and a stream of distinct images grows it forever.

Source: https://github.com/ai-dynamo/dynamo/pull/14452
  "A long-running vLLM encode worker grew its memory without limit. `EncodeWorkerHandler` kept every
   image embedding it computed in a plain `dict` that was never evicted from" (fix: a
   capacity-bounded LRU).
See also https://github.com/sgl-project/sglang/pull/25954 ("add LRU eviction for ... embedding cache").

Each entry is (576, hidden) float32 image features; every new image adds one for the life of the process.
"""

import hashlib

import _common as c
import torch

from memwarden.models import zoo

EXPECT = "unbounded-growth"
FIX_WORDS = ("LRU", "evict", "bound", "maxsize", "limit", "capacity")

MODEL = None
_FEATURE_CACHE: dict[str, torch.Tensor] = {}


def image_features(pixel_values: torch.Tensor) -> torch.Tensor:
    key = hashlib.sha1(pixel_values.numpy().tobytes()).hexdigest()
    if key not in _FEATURE_CACHE:
        _FEATURE_CACHE[key] = MODEL.get_image_features(pixel_values=pixel_values).pooler_output[0]  # MISTAKE
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
