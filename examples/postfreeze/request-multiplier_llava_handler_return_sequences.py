"""A captioning endpoint (one call per request) on a LLaVA-1.5-style model, written from a snippet
that samples 8 candidate captions per image (``num_return_sequences=8``) — but the handler only
ever returns the first one.

Source: https://github.com/huggingface/transformers/issues/37900
  "Error in input expansion for `generate` with `num_return_sequences` > 1 for multi-image inputs"
  — generate expands the inputs (ids and pixel values) ``num_return_sequences`` times.
See also https://github.com/huggingface/transformers/pull/45783 ("[generation] Encode multimodal
data only once": the image is otherwise encoded once per expanded row).

Each request therefore carries 8 copies of the image, 8 vision-tower passes, 8 prefills and 8 KV
caches to produce 7 captions that are thrown away.
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = "request-multiplier"
FIX_WORDS = ("num_return_sequences",)

MODEL = None


def handle_request(image_seed: int) -> list[int]:
    inputs = zoo.make_inputs(MODEL, prompt_tokens=24, seed=image_seed)
    with torch.no_grad():
        out = MODEL.generate(
            **inputs,
            max_new_tokens=6,
            do_sample=True,
            top_p=0.9,  # MISTAKE
            num_return_sequences=8,
            eos_token_id=None,
            pad_token_id=zoo.PAD_ID,
        )
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def main() -> None:
    global MODEL
    torch.manual_seed(0)
    MODEL = c.llava(image_px=224, patch_px=14, hidden=256, layers=4, vocab=4096)
    for request in range(2):
        print(f"request {request}: {handle_request(request)}")


if __name__ == "__main__":
    main()
