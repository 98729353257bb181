"""Fixed twin of untracked-host-memory_video_decode_all: compute the sampled frame indices first
and decode only those 8 frames (what ``VideoReader.get_batch(indices)`` does).

Source: https://github.com/EvolvingLMMs-Lab/lmms-eval/issues/283 — every frame was decoded to an
ndarray before sampling.
"""

import _common as c
import numpy as np
import torch

from memwarden.models import zoo

EXPECT = None

N_SAMPLED = 8


class Clip:
    """Stand-in for a decoder (decord/PyAV): 10 s of 320x240 video at 30 fps."""

    fps, seconds, h, w = 30, 10, 240, 320

    def __len__(self) -> int:
        return self.fps * self.seconds

    def decode(self, i: int) -> np.ndarray:
        return c.fake_rgb(self.h, self.w, seed=i)


def main() -> None:
    torch.manual_seed(0)
    model = c.qwen2_vl(hidden=128, layers=2, vocab=4096)
    clip = Clip()
    idx = np.linspace(0, len(clip) - 1, N_SAMPLED).round().astype(int)
    frames = np.stack([clip.decode(int(i)) for i in idx])
    pixels = c.resize(c.normalize(frames), 112, 140)
    inputs = c.qwen_video_inputs(model, pixels)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=6, **zoo.generate_kwargs("qwen2-vl"))
    print("answer:", out[0, inputs["input_ids"].shape[1] :].tolist())


if __name__ == "__main__":
    main()
