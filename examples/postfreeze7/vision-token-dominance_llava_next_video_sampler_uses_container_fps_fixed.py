"""Kitchen-safety clip summariser on LLaVA-NeXT-Video.

Each 12 s camera clip (30 fps) is summarised in one sentence. The frame sampler lives in a small
helper module-style function that turns a sampling rate into indices; the job's config passes the
container's own frame rate as the sampling rate, so every decoded frame becomes video tokens
(360 frames) where the model card samples 8 (or a few more) frames uniformly.
"""

import numpy as np
import torch

import _common as C

EXPECT = None

CLIP_SECONDS = 12
CONTAINER_FPS = 30
CONFIG = {
    "sample_fps": 8 / CLIP_SECONDS,  # 8 frames spread uniformly over the clip
    "frame_px": 32,
}

model = C.llava_next_video(image_px=32, patch_px=4, vision_hidden=64, hidden=128, layers=4, vocab=8192)
vocab = model.config.text_config.vocab_size
prompt = C.tokenize("USER: Summarise what happens at the stove in one sentence. ASSISTANT:", vocab - 2)


def frame_indices(total_frames: int, container_fps: float, sample_fps: float) -> np.ndarray:
    n = max(1, int(round(total_frames / container_fps * sample_fps)))
    return np.linspace(0, total_frames - 1, n).round().astype(int)


def decode_frames(clip_id: int, indices) -> torch.Tensor:
    # stands in for av/decord returning the requested frames already resized by the video processor
    frames = np.stack(
        [C.fake_rgb(CONFIG["frame_px"], CONFIG["frame_px"], seed=clip_id * 1000 + int(i)) for i in indices]
    )
    return C.normalize(frames)


def summarise(clip_id: int) -> torch.Tensor:
    total = CLIP_SECONDS * CONTAINER_FPS
    idx = frame_indices(total, CONTAINER_FPS, CONFIG["sample_fps"])
    video = decode_frames(clip_id, idx).unsqueeze(0)
    n_tok = C.llava_next_video_tokens_per_frame(model) * video.shape[1]
    ids = torch.tensor([[C.BOS_ID] + [model.config.video_token_id] * n_tok + prompt])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values_videos=video,
            max_new_tokens=16,
            do_sample=False,
        )
    return out[0, ids.shape[1] :]


if __name__ == "__main__":
    for clip in range(2):
        print(clip, summarise(clip).tolist())
