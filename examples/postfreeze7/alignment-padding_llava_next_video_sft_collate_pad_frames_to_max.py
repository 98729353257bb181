"""Sign-language clip captioning fine-tune on LLaVA-NeXT-Video.

Clips are sampled at 1 fps, so a batch holds clips of 5-9 frames. pixel_values_videos must be one
(B, T, 3, H, W) tensor, so the collate_fn pads the frame axis; it pads every batch to the dataset's
MAX_FRAMES (32) with blank frames and writes matching <video> placeholders, so the vision tower and
the language model run over ~4x more frames and tokens than the clips carry.
"""

import numpy as np
import torch

import _common as C

EXPECT = "alignment-padding"
FIX_WORDS = ["pad", "longest", "batch", "frames", "max"]

MAX_FRAMES = 32  # longest clip in the whole dataset (32 s)
BATCH = 4
STEPS = 2

torch.manual_seed(0)
model = C.llava_next_video(image_px=32, patch_px=4, vision_hidden=64, hidden=128, layers=4, vocab=8192)
model.train()
vocab = model.config.text_config.vocab_size
per_frame = C.llava_next_video_tokens_per_frame(model)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)


def dataset_item(i: int) -> dict:
    n_frames = 5 + (i * 3) % 5  # 5..9 s clips at 1 fps
    frames = C.normalize(np.stack([C.fake_rgb(32, 32, seed=i * 50 + f) for f in range(n_frames)]))
    caption = C.text_ids(14, vocab - 2, seed=i)[0].tolist()
    return {"frames": frames, "caption": caption}


def collate(items: list[dict]) -> dict:
    target = MAX_FRAMES  # MISTAKE
    videos, rows, labels = [], [], []
    prompt = C.tokenize("USER: Translate the signing into English. ASSISTANT:", vocab - 2)
    for it in items:
        f = it["frames"]
        pad = torch.zeros(target - f.shape[0], *f.shape[1:])
        videos.append(torch.cat([f, pad]))
        head = [C.BOS_ID] + [model.config.video_token_id] * (per_frame * target) + prompt
        rows.append(head + it["caption"] + [C.EOS_ID])
        labels.append([-100] * len(head) + it["caption"] + [C.EOS_ID])
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [C.PAD_ID] * (width - len(r)) for r in rows])
    lab = torch.tensor([l + [-100] * (width - len(l)) for l in labels])
    return {
        "input_ids": ids,
        "attention_mask": (ids != C.PAD_ID).long(),
        "labels": lab,
        "pixel_values_videos": torch.stack(videos),
    }


if __name__ == "__main__":
    for step in range(STEPS):
        batch = collate([dataset_item(step * BATCH + j) for j in range(BATCH)])
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(step, round(loss.item(), 3), tuple(batch["pixel_values_videos"].shape))
