"""Summarising a 4-minute lecture clip with Qwen2-VL: fps=2 sampling with no cap on the frame count.

FIXED TWIN: fps=2 sampling is capped with max_frames=32, as the reporter did to match training (video_maxlen).

What the user did: ran Qwen2.5-VL on ~5-minute videos on one or two A800s and hit CUDA OOM even after
bounding max_pixels / total_pixels, with ``"fps": 2.0``; the fix that worked was setting
``max_frames`` (the same cap used at training time, video_maxlen). Another user sampled whole videos
at fps=2 for LVBench and OOMed on an 80 GB A100 because max_frames was not applied.

Sources:
- https://github.com/QwenLM/Qwen3-VL/issues/1392 ("我已经对total_pixels进行了限制，为什么还是会OOM ...
  已通过设置max_frames解决" -- still OOM after limiting total_pixels; solved by setting max_frames)
- https://github.com/QwenLM/Qwen3-VL/issues/715 ("I have sampled the entire video using fps=2 ... I see
  the torch.OutOfMemoryError on an A100 (80GB) ... I think max_frames is not used")

Reproduction: a tiny random-weight Qwen2-VL; a 240 s, 30 fps clip whose frames are decoded lazily
(only the sampled indices), resized to 112x112. Uncapped, fps=2 gives 480 frames = 240 temporal
patches x 16 merged tokens = 3840 video tokens; the twin caps at 32 frames (256 tokens).
"""

import _common as c
import numpy as np
import torch

EXPECT = None


class LazyClip:
    """Stands in for a decord VideoReader: frames are decoded on request only."""

    def __init__(self, seconds, fps=30, h=120, w=160):
        self.fps, self.n, self.h, self.w = fps, int(seconds * fps), h, w

    def __len__(self):
        return self.n

    def get_batch(self, idx):
        return np.stack([c.fake_rgb(self.h, self.w, seed=int(i) % 97) for i in idx])


def sample_indices(n_total, video_fps, fps=2.0, max_frames=None, frame_factor=2):
    n = n_total / video_fps * fps
    if max_frames is not None:
        n = min(n, max_frames)
    n = max(frame_factor, int(round(n / frame_factor)) * frame_factor)
    return np.linspace(0, n_total - 1, n).round().astype(int)


def describe(model, clip, idx):
    frames = c.resize(c.normalize(clip.get_batch(idx)), 112, 112)
    inputs = c.qwen_inputs(model, videos=[frames], prompt_tokens=32, seed=7)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False, pad_token_id=c.PAD_ID, eos_token_id=None)
    return inputs["input_ids"].shape[1], out.shape[1]


def main():
    torch.manual_seed(0)
    model = c.qwen_vl("qwen2-vl", vision_hidden=32, vision_layers=2, hidden=128, layers=2, vocab=4096)
    clip = LazyClip(seconds=240)
    idx = sample_indices(len(clip), clip.fps, fps=2.0, max_frames=32)
    prompt_len, total = describe(model, clip, idx)
    print(f"{len(idx)} frames sampled -> prompt {prompt_len} tokens, {total - prompt_len} generated")


if __name__ == "__main__":
    main()
