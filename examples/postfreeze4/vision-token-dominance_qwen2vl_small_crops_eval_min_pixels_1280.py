"""Evaluating a Qwen2-VL model on a benchmark of small scene-text crops (~200x150 px each).

The image settings were copied from a high-resolution document-eval config: min_pixels =
1280*28*28. smart_resize then *upscales* every tiny crop to about a megapixel, so each crop costs
~1280 visual tokens (and ~5000 vision-encoder patches) instead of the few dozen its pixels hold.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

EXPECT = "vision-token-dominance"
FIX_WORDS = ["min_pixels", "upscale", "lower min_pixels"]

EVAL_CFG = {
    "min_pixels": 1280 * 28 * 28,  # MISTAKE
    "max_pixels": 1280 * 28 * 28,
}
N_CROPS = 2


def preprocess(crop):
    h, w = C.smart_resize(*crop.shape[:2], min_pixels=EVAL_CFG["min_pixels"], max_pixels=EVAL_CFG["max_pixels"])
    return C.resize(C.normalize(crop), h, w)


@torch.no_grad()
def answer(model, crop, seed):
    img = preprocess(crop)
    inputs = C.qwen_inputs(model, images=[img], prompt_tokens=16, seed=seed)
    out = model.generate(**inputs, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=C.PAD_ID)
    return img.shape[-2:], inputs["input_ids"].shape[1], out


def main():
    model = C.qwen_vl(kind="qwen2-vl", vision_hidden=32, vision_layers=2, hidden=64, layers=2, vocab=2048)
    for i in range(N_CROPS):
        crop = C.fake_rgb(150, 200, seed=i)
        size, n_tokens, _ = answer(model, crop, i)
        print(f"crop {i}: resized to {tuple(size)}, prompt {n_tokens} tokens")


if __name__ == "__main__":
    main()
