"""Qwen2-VL fed a photo at its full 1232x1232 px resolution.

What is wrong: Qwen2-VL's dynamic resolution turns every 28x28 px of the image
into one visual token, so a 1232 px photo becomes 44x44 = 1936 visual tokens
(7744 patches in the vision tower) for a 16-token question. The request was
sent with the camera's resolution because the processor's ``max_pixels`` was
left at its 12.8 MP default: the vision tower's activations, and the language
model's activations and KV for ~2000 positions, are almost all spent on the
image.

The fix (``qwen2vl_large_image_fixed.py``): resize to what the task needs --
here 448x448 px, 256 visual tokens (``max_pixels=448 * 448`` in the processor;
the predicted saving the finding gives assumes this cap).

Uses the zoo's tiny random-weight Qwen2-VL. Run: ``python qwen2vl_large_image.py`` or
``memwarden trace qwen2vl_large_image.py``.
"""

from __future__ import annotations

import torch

from memwarden.models import zoo

IMAGE_SIZE = (1232, 1232)  # (W, H) px as the camera took it


def main() -> None:
    model = zoo.build_model("qwen2-vl")
    inputs = zoo.make_inputs(model, image_size=IMAGE_SIZE, prompt_tokens=16)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=4, **zoo.generate_kwargs("qwen2-vl"))
    print(f"{inputs['input_ids'].shape[1]} prompt tokens; answer {out[0, -4:].tolist()}")


if __name__ == "__main__":
    main()
