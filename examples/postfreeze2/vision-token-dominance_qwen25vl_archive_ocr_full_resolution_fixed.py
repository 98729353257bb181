"""OCR of scanned archive pages with Qwen2.5-VL at the scans' full resolution (no max_pixels).

FIXED TWIN: the reader is given max_pixels=256*28*28 as the maintainers advise, so each page is resized to at most ~256 merged visual tokens.

What the user did: transcribed 100-year-old scanned documents (3300x2600 px JPEGs) with Qwen2.5-VL-7B
on a CPU-only machine. Without min_pixels/max_pixels the processor keeps the scan's own resolution,
so one page becomes thousands of visual tokens and the process asked for more than 80 GB of RAM;
putting explicit pixel bounds in the processor call brought it down to ~30 GB. Other users report
the same OOMs on A100-80GB and fix them with ``"max_pixels": 512 * 512`` per image.

Sources:
- https://github.com/QwenLM/Qwen3-VL/issues/891 ("MaxPixels, MinPixels - absence leading to excessive
  ram usage"; maintainer: "You can try an appropriate max_pixel value based on the available VRAM.")
- https://github.com/QwenLM/Qwen3-VL/issues/280 ("加上图片的最大像素就可以正常运行了" -- adding the image's
  max pixels made it run)
- https://github.com/kingsdigitallab/kdl-vqa/issues/15 ("Without it, some models like qwen will request
  absurd amount of VRAM")

Reproduction: a tiny random-weight Qwen2.5-VL; a 1400x1064 px "scan" (scaled down from the report).
``smart_resize`` is the qwen_vl_utils rounding; the page reader is called without a pixel budget,
so the page is encoded at 50x38 merged tokens (1900 visual tokens) instead of ~256.
"""

import _common as c
import torch

EXPECT = None

PAGE_H, PAGE_W = 1400, 1064


class PageReader:
    def __init__(self, model, max_pixels=None, min_pixels=4 * 28 * 28):
        self.model = model
        self.max_pixels = max_pixels
        self.min_pixels = min_pixels

    def prepare(self, scan_rgb):
        h, w = scan_rgb.shape[:2]
        th, tw = c.smart_resize(h, w, factor=28, min_pixels=self.min_pixels, max_pixels=self.max_pixels)
        page = c.normalize(c.pil_resize(scan_rgb, th, tw))
        return c.qwen_inputs(self.model, images=[page], prompt_tokens=20, seed=1), (th // 28, tw // 28)

    @torch.inference_mode()
    def transcribe(self, scan_rgb, max_new_tokens=24):
        inputs, grid = self.prepare(scan_rgb)
        out = self.model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=c.PAD_ID, eos_token_id=None
        )
        return out[0, inputs["input_ids"].shape[1] :], grid


def main():
    torch.manual_seed(0)
    model = c.qwen_vl("qwen2.5-vl", vision_hidden=64, vision_layers=2, hidden=128, layers=2, vocab=4096)
    reader = PageReader(model, max_pixels=256 * 28 * 28)
    for page_no in range(2):
        scan = c.fake_rgb(PAGE_H, PAGE_W, seed=page_no)
        ids, grid = reader.transcribe(scan)
        print(f"page {page_no}: {grid[0]}x{grid[1]} merged tokens, {len(ids)} new ids")


if __name__ == "__main__":
    main()
