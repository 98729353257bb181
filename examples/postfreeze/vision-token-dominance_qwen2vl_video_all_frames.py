"""Describing a 10-second clip with a Qwen2-VL-style model by passing every decoded frame
(30 fps, 300 frames) as the video, where the model card's video setting is 2 frames per second.

Source: https://huggingface.co/Qwen/Qwen2-VL-7B-Instruct/discussions/25 — "default fps = 2"
(Qwen org), and https://github.com/QwenLM/Qwen3-VL/issues/93 — "the default setting is fps=2,
min_frames=4, max_frames=768" ... "For longer videos, fps is reduced to avoid OOM due to excessive
sequence length."
See also https://github.com/EvolvingLMMs-Lab/lmms-eval/issues/336 ("VideoMME CUDA out of memory";
"The sampling frame can be controlled by passing in sampling frames num").

At 30 fps the clip is 150 temporal patches: 15x the video tokens, patch rows and prefill of the
2-fps request, for no information the model was trained to use.
"""

import _common as c
import numpy as np
import torch

from memwarden.models import zoo

EXPECT = "vision-token-dominance"
FIX_WORDS = ("fps", "frames", "sample", "nframes", "max_frames")

CLIP_FPS, CLIP_SECONDS = 30, 10


def sample_frames(fps: float) -> np.ndarray:
    n = int(CLIP_SECONDS * fps) // 2 * 2  # Qwen2-VL takes an even number of frames
    idx = np.linspace(0, CLIP_FPS * CLIP_SECONDS - 1, n).round().astype(int)
    return np.stack([c.fake_rgb(112, 112, seed=int(i)) for i in idx])  # decoder output, already 112x112


def main() -> None:
    torch.manual_seed(0)
    model = c.qwen2_vl(hidden=128, layers=2, vocab=4096)
    frames = sample_frames(fps=CLIP_FPS)  # MISTAKE
    inputs = c.qwen_video_inputs(model, c.normalize(frames))
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=6, **zoo.generate_kwargs("qwen2-vl"))
    print(
        f"{len(frames)} frames, {inputs['input_ids'].shape[1]} prompt tokens, answer",
        out[0, inputs["input_ids"].shape[1] :].tolist(),
    )


if __name__ == "__main__":
    main()
