"""Batch alt-text for product photos with an Idefics2-style model shipped in bfloat16.

Our preprocessing returns float32 pixels (numpy -> torch); the first run failed with
"Input type (float) and bias type (c10::BFloat16) should be the same", so the batch loop now
reconciles the dtypes before calling generate.
"""

import numpy as np
import torch

import _common as C

EXPECT = None

BATCH = 4


def preprocess(rgbs, side=128):
    arr = np.stack([C.pil_resize(r, side, side) for r in rgbs]).astype(np.float32) / 255.0
    arr = (arr - 0.5) / 0.5
    pix = torch.from_numpy(arr).permute(0, 3, 1, 2).unsqueeze(1)  # (B, 1, 3, H, W)
    return pix, torch.ones(pix.shape[0], 1, side, side, dtype=torch.bool)


@torch.no_grad()
def describe(model, rgbs):
    vocab_top = model.config.text_config.vocab_size - 2
    prompt = (
        [C.BOS_ID]
        + C.idefics2_image_block(model)
        + C.tokenize("Write short alt text for this product photo .", vocab_top)
    )
    batch = {"input_ids": torch.tensor([prompt] * len(rgbs))}
    batch["pixel_values"], batch["pixel_attention_mask"] = preprocess(rgbs)
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    if model.dtype != batch["pixel_values"].dtype:
        batch["pixel_values"] = batch["pixel_values"].to(model.dtype)
    out = model.generate(**batch, max_new_tokens=16, do_sample=False)
    return out[:, len(prompt) :]


def main():
    torch.manual_seed(0)
    model = C.idefics2(
        image_px=128,
        patch_px=16,
        vision_hidden=128,
        latents=32,
        hidden=256,
        layers=4,
        vocab=32000,
        ffn=1024,
        dtype=torch.bfloat16,
    )  # the checkpoint's torch_dtype
    photos = [C.fake_rgb(300, 300, seed=s) for s in range(8)]
    for i in range(0, len(photos), BATCH):
        texts = describe(model, photos[i : i + BATCH])
        print(f"photos {i}-{i + len(texts) - 1}: {tuple(texts.shape)} ({model.dtype})")


if __name__ == "__main__":
    main()
