"""Care-home fall alert on Video-LLaVA: P("yes") that the 8-frame clip shows a person falling.

Batches of camera clips are scored with one forward pass; the script log-softmaxes the full
(batch, sequence, vocab) logits and then reads the last position, so 8 x 137 video tokens of the
prompt each get a 32k-way distribution that is thrown away.
"""

import numpy as np
import torch

import _common as C

EXPECT = None

BATCH = 8
FRAMES = 8  # Video-LLaVA is trained on 8 frames per clip

model = C.video_llava(image_px=64, patch_px=16, vision_hidden=64, hidden=128, layers=2, vocab=32000)
vocab = model.config.text_config.vocab_size
YES, NO = C.tokenize("Yes No", vocab - 2)
question = C.tokenize("USER: Does a person fall down in this video? Answer yes or no. ASSISTANT:", vocab - 2)


def clip_batch(first: int) -> dict:
    vids = np.stack(
        [np.stack([C.fake_rgb(64, 64, seed=first * 100 + b * 10 + f) for f in range(FRAMES)]) for b in range(BATCH)]
    )
    pixel_values_videos = C.normalize(vids)
    n = C.video_llava_tokens_per_frame(model) * FRAMES
    ids = torch.tensor([[C.BOS_ID] + [model.config.video_token_id] * n + question] * BATCH)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values_videos": pixel_values_videos}


@torch.no_grad()
def fall_probability(batch: dict) -> torch.Tensor:
    logits = model(**batch, logits_to_keep=1).logits
    logp = torch.log_softmax(logits.float(), dim=-1)[:, -1]
    two = torch.stack([logp[:, YES], logp[:, NO]], dim=-1)
    return two.softmax(-1)[:, 0]


if __name__ == "__main__":
    for step in range(2):
        print(step, fall_probability(clip_batch(step)).tolist())
