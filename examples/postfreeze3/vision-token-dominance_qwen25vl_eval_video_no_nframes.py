"""Qwen2.5-VL video benchmark harness that samples at fps=2 with no frame cap.

What the user did: an lmms-eval-style model wrapper builds the video message with only a pixel
budget (``max_pixels``) and leaves the frame count to ``fps`` sampling. A 64-second clip then
becomes 128 frames, each patchified at the per-frame budget: the request carries 64 temporal
groups of visual tokens although the question needs a handful of frames.
Answer in the source: pass ``nframes`` (the harness's ``max_num_frames``) in the video message, or
cap ``max_frames``, so the number of frames (and the video tokens) is bounded whatever the clip
length; the OOM reports are fixed that way.
Sources: https://github.com/EvolvingLMMs-Lab/lmms-eval/issues/571 ;
https://github.com/OpenGVLab/VideoChat-R1/issues/27 ; https://github.com/QwenLM/Qwen3-VL/issues/1136
Reproduction: a tiny random-weight Qwen2.5-VL; a decoded 64 s clip at 8 fps (168x168 frames) is
sampled at fps=2 with ``nframes=None`` (128 frames, 2304 video tokens) and one 8-token answer is
generated for each of two questions.
"""

import _common as c
import numpy as np
import torch

EXPECT = "vision-token-dominance"
FIX_WORDS = ("nframes", "max_frames", "max_num_frames", "frames")

NATIVE_FPS = 8
CLIP_SECONDS = 64
FRAME_PX = 168


def sample_indices(total: int, native_fps: float, fps: float = 2.0, nframes: int | None = None) -> np.ndarray:
    """qwen_vl_utils-style frame sampling: ``nframes`` if given, else ``fps`` frames a second (even)."""
    if nframes is None:
        nframes = int(total / native_fps * fps)
    nframes = max(2, nframes - nframes % 2)
    return np.linspace(0, total - 1, nframes).round().astype(int)


def decode_frames(indices: np.ndarray) -> torch.Tensor:
    """The decoder's frames at ``indices`` as (T, 3, H, W) normalised floats."""
    rgb = np.stack([c.fake_rgb(FRAME_PX, FRAME_PX, seed=int(i)) for i in indices])
    return c.normalize(rgb)


def main() -> None:
    model = c.qwen_vl("qwen2.5-vl", hidden=128, layers=2, vocab=4096, vision_hidden=32)
    total_frames = NATIVE_FPS * CLIP_SECONDS
    indices = sample_indices(total_frames, NATIVE_FPS, fps=2.0, nframes=None)  # MISTAKE
    video = decode_frames(indices)
    answers = []
    with torch.inference_mode():
        for q in range(2):
            inputs = c.qwen_inputs(model, videos=[video], prompt_tokens=24, seed=q)
            out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
            answers.append(out[0, inputs["input_ids"].shape[1] :].tolist())
    print(f"{len(indices)} frames, {int((inputs['input_ids'] == model.config.video_token_id).sum())} video tokens")
    print("answers:", answers)


if __name__ == "__main__":
    main()
