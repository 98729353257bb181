"""Fixed twin of request-multiplier_llava_handler_return_sequences: the handler samples the one
caption it returns (``num_return_sequences=1``).

Source: https://github.com/huggingface/transformers/issues/37900 (generate expands ids and pixel
values ``num_return_sequences`` times).
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = None

MODEL = None


def handle_request(image_seed: int) -> list[int]:
    inputs = zoo.make_inputs(MODEL, prompt_tokens=24, seed=image_seed)
    with torch.no_grad():
        out = MODEL.generate(
            **inputs, max_new_tokens=6, do_sample=True, top_p=0.9, eos_token_id=None, pad_token_id=zoo.PAD_ID
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
