"""Video QA with LLaVA on a 12-second 720p clip: the model sees 8 frames sampled uniformly.

The script asks the decoder for the 8 sampled frames only (decord-style get_batch), so just those
frames are ever decoded into host memory.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import numpy as np
import torch

EXPECT = None
FIX_WORDS = ["decode only", "sampled frames", "get_batch"]

FPS, SECONDS, H, W = 30, 12, 720, 1280
N_SAMPLED = 8


class FakeVideoReader:
    """Stands in for a decoder (decord / PyAV): frame i decoded on demand as (H, W, 3) uint8."""

    def __init__(self, n_frames):
        self.n_frames = n_frames
        self._base = C.fake_rgb(H, W, seed=0)

    def __len__(self):
        return self.n_frames

    def decode(self, i):
        frame = np.empty_like(self._base)
        np.add(self._base, np.uint8(i % 251), out=frame)
        return frame

    def iter_frames(self):
        for i in range(self.n_frames):
            yield self.decode(i)

    def get_batch(self, indices):
        return np.stack([self.decode(i) for i in indices])


def sampled_frames(reader):
    idx = np.linspace(0, len(reader) - 1, N_SAMPLED).round().astype(int)
    return reader.get_batch(idx)  # decode only the sampled frames


@torch.no_grad()
def ask(model, frames):
    pix = C.resize(C.normalize(frames), 112, 112)
    ids = C.llava_prompt(model, n_images=len(frames), prompt_tokens=20)
    return model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        pixel_values=pix,
        max_new_tokens=6,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=C.PAD_ID,
    )


def main():
    model = C.llava(image_px=112, patch_px=14, hidden=64, layers=2, vocab=1024)
    reader = FakeVideoReader(FPS * SECONDS)
    frames = sampled_frames(reader)
    print(ask(model, frames).shape)


if __name__ == "__main__":
    main()
