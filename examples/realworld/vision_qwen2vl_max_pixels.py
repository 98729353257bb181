"""Qwen2-VL evaluated at the processor's default ``max_pixels`` on a large photo.

Source: https://github.com/EvolvingLMMs-Lab/lmms-eval/issues/436
    "the major issue of Qwen2-VL is the max_pixels, it's default is `16384 * 28 * 28` (28x28 each
     token, 16384 max tokens), you can set this to a very small number like `256 * 28 * 28` to see
     if OOM still exists."
and https://github.com/oumi-ai/oumi/pull/908 ("For large images it can generate too many causing OOM").

Fix (``_fixed``): ``AutoProcessor.from_pretrained(..., max_pixels=256 * 28 * 28)`` -- here an
image resized to 448x448 px.
"""

from __future__ import annotations

import torch

from memwarden.models import zoo

EXPECT = "vision-token-dominance"
FIX_WORDS = ("max_pixels",)
IMAGE_SIZE = (1232, 1232)


def main() -> None:
    model = zoo.build_model("qwen2-vl")
    inputs = zoo.make_inputs(model, image_size=IMAGE_SIZE, prompt_tokens=16)  # MISTAKE
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=4, **zoo.generate_kwargs("qwen2-vl"))
    print(out[0, -4:].tolist())


if __name__ == "__main__":
    main()
