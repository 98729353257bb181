"""Fixed twin of ``qwen2vl_large_image.py``: the image is resized to 448x448 px first.

448 px makes 16x16 = 256 visual tokens (1024 patches in the vision tower) instead of 1936,
which is what ``max_pixels=448 * 448`` in Qwen2-VL's processor does. Encoder activations,
language-model activations and KV shrink with the token count.

Uses the zoo's tiny random-weight Qwen2-VL. Run: ``python qwen2vl_large_image_fixed.py`` or
``memwarden trace qwen2vl_large_image_fixed.py``.
"""

from __future__ import annotations

import torch

from memwarden.models import zoo

IMAGE_SIZE = (448, 448)  # (W, H) px after resizing to the token budget


def main() -> None:
    model = zoo.build_model("qwen2-vl")
    inputs = zoo.make_inputs(model, image_size=IMAGE_SIZE, prompt_tokens=16)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=4, **zoo.generate_kwargs("qwen2-vl"))
    print(f"{inputs['input_ids'].shape[1]} prompt tokens; answer {out[0, -4:].tolist()}")


if __name__ == "__main__":
    main()
