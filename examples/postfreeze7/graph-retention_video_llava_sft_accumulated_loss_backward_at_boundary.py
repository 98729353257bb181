"""Video-LLaVA instruction fine-tune on cooking clips with gradient accumulation (hand-written loop).

The loop keeps a running `accum_loss` tensor and calls backward() once per optimizer step, at the
accumulation boundary. Every micro-batch's autograd graph (8 frames x 8 clips through the vision
tower and the language model) stays alive until that single backward.
"""

import numpy as np
import torch

import _common as C

EXPECT = "graph-retention"
FIX_WORDS = ["backward", "micro-batch", "accumulation", "graph", "each"]

ACCUM = 4
MICRO_BATCH = 2
FRAMES = 8

torch.manual_seed(0)
model = C.video_llava(image_px=32, patch_px=4, vision_hidden=64, hidden=128, layers=4, vocab=8192)
model.train()
vocab = model.config.text_config.vocab_size
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
n_video = C.video_llava_tokens_per_frame(model) * FRAMES


def micro_batch(k: int) -> dict:
    vids = np.stack(
        [np.stack([C.fake_rgb(32, 32, seed=k * 97 + b * 13 + f) for f in range(FRAMES)]) for b in range(MICRO_BATCH)]
    )
    prompt = C.tokenize("USER: Which cooking step is shown? ASSISTANT:", vocab - 2)
    answer = C.text_ids(20, vocab - 2, seed=k)[0].tolist()
    head = [C.BOS_ID] + [model.config.video_token_id] * n_video + prompt
    ids = torch.tensor([head + answer] * MICRO_BATCH)
    labels = torch.tensor([[-100] * len(head) + answer] * MICRO_BATCH)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "labels": labels,
        "pixel_values_videos": C.normalize(vids),
    }


if __name__ == "__main__":
    accum_loss = 0.0
    for k in range(2 * ACCUM):
        out = model(**micro_batch(k))
        accum_loss = accum_loss + out.loss / ACCUM  # MISTAKE
        if (k + 1) % ACCUM == 0:
            if torch.is_tensor(accum_loss) and accum_loss.requires_grad:
                accum_loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            print("step", (k + 1) // ACCUM, float(accum_loss))
            accum_loss = 0.0
