"""Video-QA evaluation of a SmolVLM (Idefics3-style) model on 2-minute clips.

The frame sampler takes one frame per second of the whole clip (the "1fps" setting) instead of
the handful of frames the model card's video recipe uses, so a 2-minute clip becomes 120 images
worth of visual tokens in a single prompt.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import numpy as np
import torch

EXPECT = "vision-token-dominance"
FIX_WORDS = ["max_frames", "fewer frames", "sample 8 frames"]

VIDEO_SECONDS = 120
NATIVE_FPS = 24
FRAME_PX = 128
MAX_FRAMES = 8


def sample_frame_indices(n_frames, fps):
    step = fps  # one frame per second  # MISTAKE
    return list(range(0, n_frames, step))


def load_clip_frames(indices, seed=0):
    """Decode only the requested frames (as decord.VideoReader.get_batch would)."""
    return np.stack([C.fake_rgb(FRAME_PX, FRAME_PX, seed=seed + i) for i in indices])


def build_prompt(model, n_frames, question_tokens=24):
    block = C.idefics3_image_block(model)
    words = C.text_ids(question_tokens, model.config.image_token_id - 3, seed=1)[0].tolist()
    ids = [C.BOS_ID] + words[:4]
    for _ in range(n_frames):
        ids += block
    return torch.tensor([ids + words[4:]])


@torch.no_grad()
def answer(model, frames):
    pixel_values = C.normalize(frames).unsqueeze(0)  # (1, N, 3, H, W)
    input_ids = build_prompt(model, frames.shape[0])
    return model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        pixel_values=pixel_values,
        pixel_attention_mask=torch.ones(1, frames.shape[0], FRAME_PX, FRAME_PX, dtype=torch.bool),
        max_new_tokens=4,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=C.PAD_ID,
    )


def main():
    model = C.idefics3(image_px=FRAME_PX, patch_px=8, scale=2, vision_hidden=64, hidden=128, layers=2, vocab=4096)
    n_frames = VIDEO_SECONDS * NATIVE_FPS
    idx = sample_frame_indices(n_frames, NATIVE_FPS)
    frames = load_clip_frames(idx)
    out = answer(model, frames)
    print(f"{len(idx)} frames -> prompt of {out.shape[1] - 4} tokens")


if __name__ == "__main__":
    main()
