"""Receipt field extraction with a Pixtral-style (Mistral-Small-3.1 architecture) VLM. Phone photos
(3024x4032) are resized so the longest edge is the processor's longest_edge before patching."""

import math

import torch

import _common as C

EXPECT = None

LONGEST_EDGE = 1024
UNIT = 32  # patch 16 x merge 2


def preprocess(rgb):
    h, w = rgb.shape[:2]
    s = min(1.0, LONGEST_EDGE / max(h, w))
    nh, nw = max(UNIT, math.floor(h * s / UNIT) * UNIT), max(UNIT, math.floor(w * s / UNIT) * UNIT)
    return C.resize(C.normalize(C.pil_resize(rgb, nh, nw)), nh, nw)


@torch.no_grad()
def main():
    torch.manual_seed(0)
    model = C.mistral3(
        patch_px=16, merge=2, vision_hidden=64, vision_layers=2, max_image_px=1024, hidden=128, layers=2, vocab=4096
    )
    vocab_top = model.config.text_config.vocab_size - 3
    prompt = C.tokenize("[INST] Extract merchant , date and total as JSON . [/INST]", vocab_top)
    for i in range(2):
        page = preprocess(C.fake_rgb(2016, 1512, seed=i))
        inputs = C.mistral3_inputs(model, page, prompt)
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
        n_img = int((inputs["input_ids"] == model.config.image_token_id).sum())
        print(
            f"receipt {i}: {tuple(page.shape[-2:])}, {n_img} image tokens, {out.shape[1] - inputs['input_ids'].shape[1]} new tokens"
        )


if __name__ == "__main__":
    main()
