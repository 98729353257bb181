"""Video QA preprocessing that decodes the whole clip into RAM (torchvision.io.read_video style).

FIXED TWIN: only the 16 sampled indices are decoded (decord get_batch style).

What the user did: ran Qwen2-VL / Qwen2.5-VL video inference through qwen_vl_utils'
``process_vision_info`` with the torchvision backend on a 10-minute 854x480 30 fps video; host RAM
(64 GB) ran out and the process was killed, although only a few dozen frames are sent to the model.
torchvision's ``read_video`` converts every decoded frame to a numpy array in a list and stacks them;
the maintainers point to decord, which decodes only the requested indices.

Sources:
- https://github.com/QwenLM/Qwen3-VL/issues/1938 ("通过qwen_vl_utils的process_vision_info加载视频为什么内存会oom？"
  -- why does loading video via process_vision_info OOM host memory; reply: "decord is prefered
  without memory issue")
- https://github.com/fanegg/Human3R/issues/26 ("the demo loads all video frames into DRAM simultaneously
  before processing, causing excessive memory consumption")
- https://github.com/showlab/Q2A/issues/3 (torchvision.io.read_video -> decord VideoReader solved the
  memory shortage)

Reproduction: a tiny random-weight Qwen2-VL; a 24 s, 30 fps, 240x320 "video" (720 frames, ~170 MB of
uint8 once stacked); 16 frames are sampled for the model. ``read_video`` mimics torchvision (list of
per-frame arrays, then np.stack), ``read_frames`` mimics decord's get_batch.
"""

import _common as c
import numpy as np
import torch

EXPECT = None

SECONDS, FPS, H, W = 24, 30, 240, 320


def decode_frame(i):
    return c.fake_rgb(H, W, seed=i % 50)


def read_video(path):
    """Everything, like torchvision.io.read_video: a list of frames, then one stacked array."""
    frames = [decode_frame(i) for i in range(SECONDS * FPS)]
    return np.stack(frames)


def read_frames(path, indices):
    """Only the sampled frames, like decord.VideoReader(path).get_batch(indices)."""
    return np.stack([decode_frame(int(i)) for i in indices])


def fetch_video(path, nframes=16):
    indices = np.linspace(0, SECONDS * FPS - 1, nframes).round().astype(int)
    video = read_frames(path, indices)
    return c.resize(c.normalize(video), 112, 112)


def main():
    torch.manual_seed(0)
    model = c.qwen_vl("qwen2-vl", hidden=128, layers=2, vocab=4096)
    frames = fetch_video("lecture.mp4")
    inputs = c.qwen_inputs(model, videos=[frames], prompt_tokens=24, seed=2)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False, pad_token_id=c.PAD_ID, eos_token_id=None)
    print(f"{frames.shape[0]} frames -> {inputs['input_ids'].shape[1]} prompt tokens, {out.shape[1]} total")


if __name__ == "__main__":
    main()
