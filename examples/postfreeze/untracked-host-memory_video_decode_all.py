"""Video question answering on a Qwen2-VL-style model where the clip is first decoded completely
into a list of numpy frames, and only then 8 frames are sampled from that list.

Source: https://github.com/EvolvingLMMs-Lab/lmms-eval/issues/283
  "It seems like qwen_vl_utils will occupy excessive memory when pre-process, until it get killed
   by system." — traceback ends in ``vframes_list = [frame.to_rgb().to_ndarray() for frame in
   video_frames]`` (every frame decoded to an ndarray).
See also https://github.com/dmlc/decord/issues/197 ("Significant RAM usage increase on performing
a get batch of 4K video").

The 300 decoded frames (10 s at 30 fps) are numpy memory outside torch and stay alive through
the whole model call, although the model only sees 8 of them.
"""

import _common as c
import numpy as np
import torch

from memwarden.models import zoo

EXPECT = "untracked-host-memory"
FIX_WORDS = ("indices", "sample", "only", "del", "get_batch", "decode")

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
    all_frames = [clip.decode(i) for i in range(len(clip))]  # MISTAKE
    idx = np.linspace(0, len(clip) - 1, N_SAMPLED).round().astype(int)
    frames = np.stack([all_frames[i] for i in idx])
    pixels = c.resize(c.normalize(frames), 112, 140)
    inputs = c.qwen_video_inputs(model, pixels)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=6, **zoo.generate_kwargs("qwen2-vl"))
    print("answer:", out[0, inputs["input_ids"].shape[1] :].tolist())


if __name__ == "__main__":
    main()
