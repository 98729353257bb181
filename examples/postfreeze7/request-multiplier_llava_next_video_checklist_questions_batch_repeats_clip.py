"""Body-cam review checklist on LLaVA-NeXT-Video: six yes/no checklist questions per clip.

To "use the batch dimension", the reviewer tool stacks one row per question and repeats the clip's
16 frames for every row (pixel_values_videos.repeat), so the vision tower, the video tokens, the
prefill and the KV cache are all computed six times for one clip.
"""

import numpy as np
import torch

import _common as C

EXPECT = "request-multiplier"
FIX_WORDS = ["repeat", "batch", "once", "prefix", "cache"]

FRAMES = 16
CHECKLIST = [
    "Is the officer's camera view obstructed?",
    "Is a weapon visible?",
    "Does anyone run?",
    "Is it night time?",
    "Is a vehicle visible?",
    "Are there more than three people?",
]
ROWS_PER_CLIP = len(CHECKLIST)  # MISTAKE

model = C.llava_next_video(image_px=32, patch_px=4, vision_hidden=64, hidden=128, layers=4, vocab=8192)
vocab = model.config.text_config.vocab_size


@torch.no_grad()
def review(clip_id: int) -> list[list[int]]:
    video = C.normalize(np.stack([C.fake_rgb(32, 32, seed=clip_id * 100 + f) for f in range(FRAMES)])).unsqueeze(0)
    n = C.llava_next_video_tokens_per_frame(model) * FRAMES
    qs = [C.tokenize("USER: " + q + " Answer yes or no. ASSISTANT:", vocab - 2) for q in CHECKLIST]
    width = max(len(q) for q in qs)
    answers = []
    for start in range(0, len(qs), ROWS_PER_CLIP):
        chunk = qs[start : start + ROWS_PER_CLIP]
        rows = [[C.PAD_ID] * (width - len(q)) + [C.BOS_ID] + [model.config.video_token_id] * n + q for q in chunk]
        ids = torch.tensor(rows)
        mask = (ids != C.PAD_ID).long()
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            pixel_values_videos=video.repeat(len(chunk), 1, 1, 1, 1),
            max_new_tokens=4,
            do_sample=False,
        )
        answers += out[:, ids.shape[1] :].tolist()
    return answers


if __name__ == "__main__":
    for clip in range(2):
        print(clip, [a[0] for a in review(clip)])
