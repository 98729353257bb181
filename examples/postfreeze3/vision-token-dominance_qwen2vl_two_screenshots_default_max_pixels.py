"""Qwen2-VL multi-image comparison run with the processor's default pixel ceiling.

What the user did: two 1436x717 screenshots are compared with Qwen2-VL through the README demo code,
keeping the processor's default ``max_pixels`` (16384*28*28, i.e. no practical ceiling) "so as not to
lose detail". Each screenshot becomes ~1300 visual tokens and the vision tower attends over ~5300
patches per image.
Answer in the source: lower ``max_pixels`` (x pixels = x/784 tokens), e.g. ``256*28*28``, then raise
it gradually to a bearable threshold; that fixed the OOM in the evaluation.
Sources: https://github.com/EvolvingLMMs-Lab/lmms-eval/issues/436 ; https://github.com/QwenLM/Qwen3-VL/issues/185
Reproduction: a tiny random-weight Qwen2-VL; two decoded 717x1436 screenshots are smart-resized with
``max_pixels=16384*28*28`` (1326 tokens each) and one 8-token answer is generated.
"""

import _common as c
import torch

EXPECT = "vision-token-dominance"
FIX_WORDS = ("max_pixels", "min_pixels", "256*28*28", "resolution")

SCREEN_H, SCREEN_W = 717, 1436


def load_image(seed: int, max_pixels: int) -> torch.Tensor:
    """Decode, smart-resize (multiples of 28 within the pixel budget) and normalise one screenshot."""
    h, w = c.smart_resize(SCREEN_H, SCREEN_W, max_pixels=max_pixels)
    return c.normalize(c.pil_resize(c.fake_rgb(SCREEN_H, SCREEN_W, seed=seed), h, w))


def main() -> None:
    model = c.qwen_vl("qwen2-vl", hidden=128, layers=2, vocab=4096, vision_hidden=32)
    max_pixels = 16384 * 28 * 28  # MISTAKE
    images = [load_image(seed, max_pixels) for seed in range(2)]
    inputs = c.qwen_inputs(model, images=images, prompt_tokens=32)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    n_img = int((inputs["input_ids"] == model.config.image_token_id).sum())
    print(f"image sizes {[tuple(i.shape[-2:]) for i in images]}, {n_img} image tokens")
    print("answer:", out[0, inputs["input_ids"].shape[1] :].tolist())


if __name__ == "__main__":
    main()
