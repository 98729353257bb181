"""InternVL-style single-document QA with the card's ``max_num=12`` tiling (correct, memory-heavy).

What the user does: one dense, high-resolution document page is asked about with the model card's
single-image path, ``load_image(path, max_num=12)``: the page is cut into up to 12 tiles plus a
thumbnail so that small print stays legible. The maintainers recommend ``max_num=1`` only for video
frames; for one high-resolution image the 12-tile budget is the intended use.
Sources: https://github.com/OpenGVLab/InternVL/issues/1235 ; https://github.com/OpenGVLab/InternVL/issues/191
Reproduction: a tiny random-weight LLaVA-style model (32 px tiles of 16 tokens stand in for 448 px
tiles); one 256x192 page tiled into 12 tiles + thumbnail and a 16-token answer.
"""

import _common as c
import torch

EXPECT = None


def main() -> None:
    model = c.llava(image_px=32, patch_px=8, vision_hidden=64, hidden=128, layers=2, vocab=4096)
    page = c.normalize(c.fake_rgb(256, 192, seed=3))
    pixel_values = c.internvl_tiles(page, 32, max_num=12)
    ids = c.llava_prompt(model, n_images=pixel_values.shape[0], prompt_tokens=40)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixel_values, max_new_tokens=16
        )
    print(f"{pixel_values.shape[0]} tiles, prompt {ids.shape[1]} tokens; answer {out[0, ids.shape[1] :].tolist()}")


if __name__ == "__main__":
    main()
