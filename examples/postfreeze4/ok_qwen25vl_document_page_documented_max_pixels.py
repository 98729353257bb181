"""Reading a scanned A4 page with a Qwen2.5-VL-style model at a documented resolution budget:
the page is resized with smart_resize(min_pixels=256*28*28, max_pixels=512*28*28), a range the
model card suggests for documents, and answered under no_grad. The ~500 visual tokens are what
small print needs; the run is heavy but bounded."""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

EXPECT = None

MIN_PIXELS = 256 * 28 * 28
MAX_PIXELS = 512 * 28 * 28


@torch.no_grad()
def main():
    model = C.qwen_vl(kind="qwen2.5-vl", vision_hidden=64, vision_layers=2, hidden=128, layers=2, vocab=4096)
    page = C.fake_rgb(1754, 1240)  # A4 at 150 dpi
    h, w = C.smart_resize(*page.shape[:2], min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    img = C.resize(C.normalize(page), h, w)
    inputs = C.qwen_inputs(model, images=[img], prompt_tokens=24)
    out = model.generate(**inputs, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=C.PAD_ID)
    print((h, w), inputs["input_ids"].shape[1], out.shape)


if __name__ == "__main__":
    main()
