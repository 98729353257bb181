"""Correct library path: LLaVA-1.5-style captioning at the vision tower's native 336x336 px,
three different photos batched in one ``generate`` under ``torch.no_grad()``.

Source: https://huggingface.co/docs/transformers/model_doc/llava — LLaVA-1.5 pairs a CLIP
ViT-L/14 at 336 px with the language model; every image becomes 576 tokens ((336/14)^2), whatever
its original size, because the processor resizes it to the tower's fixed resolution.
See also https://github.com/haotian-liu/LLaVA/issues/1412 (multi-turn use of the same model).

576 image tokens per row is large but it is the model's fixed cost: nothing here is upscaled,
duplicated or retained. The three rows are three different images, not copies of one request.
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = None


def main() -> None:
    torch.manual_seed(0)
    model = c.llava(image_px=336, patch_px=14, hidden=128, layers=2, vocab=4096)
    inputs = zoo.make_inputs(model, prompt_tokens=24, batch=3, seed=7)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, **zoo.generate_kwargs("llava"))
    for row, ids in enumerate(out[:, inputs["input_ids"].shape[1] :].tolist()):
        print(f"photo {row}: {ids}")


if __name__ == "__main__":
    main()
