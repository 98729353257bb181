"""Qwen2-VL video QA at the documented sampling: fps=2 with a frame cap (correct, memory-heavy).

What the user does: a 20-second 224x224 clip is sampled the way the Qwen-VL README configures video
input: ``fps=2.0`` with ``max_frames`` bounding the frame count (here 32 of the 40 fps-2 frames), at a
per-frame resolution inside the video pixel budget. The request is large (1024 video tokens) because
the question is about the clip's content over time, not because of a setting left open.
Sources: https://github.com/QwenLM/Qwen3-VL/issues/1136 ; https://github.com/EvolvingLMMs-Lab/lmms-eval/issues/571
Reproduction: a tiny random-weight Qwen2-VL; 32 frames of 224x224 (16 temporal groups x 64 tokens)
and one 16-token answer under ``inference_mode``.
"""

import _common as c
import numpy as np
import torch

EXPECT = None

NATIVE_FPS, SECONDS, FPS, MAX_FRAMES = 25, 20, 2.0, 32


def main() -> None:
    model = c.qwen_vl("qwen2-vl", hidden=128, layers=2, vocab=4096, vision_hidden=32)
    total = NATIVE_FPS * SECONDS
    n = min(int(SECONDS * FPS), MAX_FRAMES)
    indices = np.linspace(0, total - 1, n).round().astype(int)
    video = c.normalize(np.stack([c.fake_rgb(224, 224, seed=int(i)) for i in indices]))
    inputs = c.qwen_inputs(model, videos=[video], prompt_tokens=32)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    print(f"{n} frames, {int((inputs['input_ids'] == model.config.video_token_id).sum())} video tokens")
    print("answer:", out[0, inputs["input_ids"].shape[1] :].tolist())


if __name__ == "__main__":
    main()
