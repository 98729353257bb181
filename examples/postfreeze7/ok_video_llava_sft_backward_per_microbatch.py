"""Video-LLaVA fine-tune with gradient accumulation done the usual way: each micro-batch's
(loss / ACCUM).backward() runs right away, the logged running loss is a float, optimizer step at the
boundary. Two clips of 8 frames per micro-batch."""

import numpy as np
import torch

import _common as C

EXPECT = None

ACCUM, MICRO_BATCH, FRAMES = 4, 2, 8
torch.manual_seed(0)
model = C.video_llava(image_px=32, patch_px=4, vision_hidden=64, hidden=128, layers=4, vocab=8192)
model.train()
vocab = model.config.text_config.vocab_size
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
n_video = C.video_llava_tokens_per_frame(model) * FRAMES

if __name__ == "__main__":
    running = 0.0
    for k in range(2 * ACCUM):
        vids = np.stack(
            [np.stack([C.fake_rgb(32, 32, seed=k * 31 + b * 7 + f) for f in range(FRAMES)]) for b in range(MICRO_BATCH)]
        )
        head = (
            [C.BOS_ID]
            + [model.config.video_token_id] * n_video
            + C.tokenize("USER: What is being assembled? ASSISTANT:", vocab - 2)
        )
        ans = C.text_ids(20, vocab - 2, seed=k)[0].tolist()
        ids = torch.tensor([head + ans] * MICRO_BATCH)
        labels = torch.tensor([[-100] * len(head) + ans] * MICRO_BATCH)
        loss = model(
            input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, pixel_values_videos=C.normalize(vids)
        ).loss
        (loss / ACCUM).backward()
        running += loss.item() / ACCUM
        if (k + 1) % ACCUM == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
            print("step", (k + 1) // ACCUM, round(running, 3))
            running = 0.0
