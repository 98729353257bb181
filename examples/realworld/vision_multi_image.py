"""Multi-image inference with Qwen2-VL: four high-resolution images in one request.

Source: https://github.com/QwenLM/Qwen3-VL/issues/185 ("多图推理OOM" -- multi-image inference OOM)
    "did you try lowering max_pixels ($$x$$ pixels = $$x/784$$ tokens) as in the README?
     ... resolutions: [1436, 717] or higher"

Fix: lower ``max_pixels`` per image (the visual tokens, not the text, fill the sequence).
"""

from __future__ import annotations

import torch

from memwarden.models import zoo

EXPECT = "vision-token-dominance"
FIX_WORDS = ("max_pixels",)


def main() -> None:
    model = zoo.build_model("qwen2-vl")
    inputs = zoo.make_inputs(model, image_size=(1428, 728), prompt_tokens=20)  # MISTAKE
    with torch.no_grad():
        out = model(**inputs)
    print(tuple(out.logits.shape))


if __name__ == "__main__":
    main()
