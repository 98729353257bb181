"""InternVL-style video QA that tiles every sampled frame like a single high-resolution image.

What the user did: to ask about a video with an InternVL chat model, the user samples 8 frames and
runs each one through the model card's single-image ``load_image(..., max_num=12)`` path, so every
16:9 frame is cut into 8 tiles plus a thumbnail. The prompt carries 72 tiles of visual tokens for
8 frames.
Answer in the source: for video, set ``max_num=1`` so that each frame is resized to one 448 px
tile (the maintainers' advice; the card's video example does the same), then concatenate the frames.
Sources: https://github.com/OpenGVLab/InternVL/issues/191 ; https://github.com/OpenGVLab/InternVL/issues/1235
Reproduction: a tiny random-weight LLaVA-style model (CLIP ViT, 32 px tiles of 16 tokens stand in
for 448 px tiles); 8 decoded 144x256 frames are tiled with ``max_num=12`` (9 tiles each, 1152 image
tokens) and an 8-token answer is generated.
"""

import _common as c
import numpy as np
import torch

EXPECT = "vision-token-dominance"
FIX_WORDS = ("max_num", "tile", "tiles", "max_num=1")

TILE_PX = 32
N_FRAMES = 8


def load_frame(rgb: np.ndarray, max_num: int) -> torch.Tensor:
    """The card's ``load_image`` on one decoded frame: normalise, tile, thumbnail."""
    return c.internvl_tiles(c.normalize(rgb), TILE_PX, max_num=max_num)


def main() -> None:
    model = c.llava(image_px=TILE_PX, patch_px=8, vision_hidden=64, hidden=128, layers=2, vocab=4096)
    frames = [c.fake_rgb(144, 256, seed=i) for i in range(N_FRAMES)]
    pixel_values = torch.cat([load_frame(f, max_num=12) for f in frames])  # MISTAKE
    ids = c.llava_prompt(model, n_images=pixel_values.shape[0], prompt_tokens=32)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=pixel_values,
            max_new_tokens=8,
            do_sample=False,
        )
    print(f"{pixel_values.shape[0]} tiles for {N_FRAMES} frames, prompt {ids.shape[1]} tokens")
    print("answer:", out[0, ids.shape[1] :].tolist())


if __name__ == "__main__":
    main()
