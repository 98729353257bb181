"""A captioning endpoint for CCTV snapshots built on GIT. Clients often retry a request, so the
decoded + normalised pixels are memoised by (camera, timestamp)."""

from functools import lru_cache

import torch

import _common as C

EXPECT = "unbounded-growth"
FIX_WORDS = ["maxsize", "lru_cache", "bounded", "evict", "cache_clear"]

SIDE = 224
CAMERAS = 6


@lru_cache(maxsize=None)  # MISTAKE
def load_pixels(camera, ts):
    rgb = C.fake_rgb(270, 480, seed=camera * 100_000 + ts)
    return C.resize(C.normalize(rgb), SIDE, SIDE)


class CaptionEndpoint:
    def __init__(self):
        torch.manual_seed(0)
        self.model = C.git_captioner(image_px=SIDE, patch_px=16, vision_hidden=64, hidden=64, layers=2, vocab=2048)

    @torch.no_grad()
    def handle(self, camera, ts):
        pix = load_pixels(camera, ts).unsqueeze(0)
        out = self.model.generate(
            pixel_values=pix, input_ids=torch.tensor([[C.BOS_ID]]), max_new_tokens=8, do_sample=False
        )
        return out[0, 1:]


def main():
    ep = CaptionEndpoint()
    served = 0
    for ts in range(30):
        for cam in range(CAMERAS):
            ep.handle(cam, ts)
            if ts % 10 == 0 and cam == 0:
                ep.handle(cam, ts)  # client retry
            served += 1
    print(f"served {served} snapshots, cache {load_pixels.cache_info()}")


if __name__ == "__main__":
    main()
