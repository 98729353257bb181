"""Fixed twin of vision-token-dominance_qwen2vl_video_all_frames: frames sampled at the model
card's 2 fps (20 frames for the 10-second clip).

Source: https://huggingface.co/Qwen/Qwen2-VL-7B-Instruct/discussions/25 — "default fps = 2";
https://github.com/QwenLM/Qwen3-VL/issues/93 — "the default setting is fps=2".
"""

import _common as c
import numpy as np
import torch

from memwarden.models import zoo

EXPECT = None

CLIP_FPS, CLIP_SECONDS = 30, 10


def sample_frames(fps: float) -> np.ndarray:
    n = int(CLIP_SECONDS * fps) // 2 * 2  # Qwen2-VL takes an even number of frames
    idx = np.linspace(0, CLIP_FPS * CLIP_SECONDS - 1, n).round().astype(int)
    return np.stack([c.fake_rgb(112, 112, seed=int(i)) for i in idx])  # decoder output, already 112x112


def main() -> None:
    torch.manual_seed(0)
    model = c.qwen2_vl(hidden=128, layers=2, vocab=4096)
    frames = sample_frames(fps=2.0)
    inputs = c.qwen_video_inputs(model, c.normalize(frames))
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=6, **zoo.generate_kwargs("qwen2-vl"))
    print(
        f"{len(frames)} frames, {inputs['input_ids'].shape[1]} prompt tokens, answer",
        out[0, inputs["input_ids"].shape[1] :].tolist(),
    )


if __name__ == "__main__":
    main()
