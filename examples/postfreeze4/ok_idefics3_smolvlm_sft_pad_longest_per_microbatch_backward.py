"""SmolVLM (Idefics3-style) fine-tune done right: batches padded to their longest sample, labels
masked on padding and image tokens, each micro-batch backpropagated immediately (gradient
accumulation through .grad), only float losses logged. Heavy because of the batch size and the
number of image tokens, not because of waste."""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

EXPECT = None

MICRO_BATCH = 8
ACCUM = 2
IMAGE_PX = 128


def micro_batch(model, seed):
    g = torch.Generator().manual_seed(seed)
    block = C.idefics3_image_block(model)
    rows = []
    for _ in range(MICRO_BATCH):
        n = int(torch.randint(60, 160, (1,), generator=g))
        rows.append([C.BOS_ID] + block + torch.randint(C.FIRST_TEXT_ID, 4000, (n,), generator=g).tolist())
    longest = max(len(r) for r in rows)
    ids = torch.full((len(rows), longest), C.PAD_ID)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    labels = ids.masked_fill((mask == 0) | (ids >= model.config.image_token_id - 2), -100)
    pix = torch.randn(len(rows), 1, 3, IMAGE_PX, IMAGE_PX, generator=g)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": labels,
        "pixel_values": pix,
        "pixel_attention_mask": torch.ones(len(rows), 1, IMAGE_PX, IMAGE_PX, dtype=torch.bool),
    }


def main():
    model = C.idefics3(image_px=IMAGE_PX, patch_px=8, scale=2, vision_hidden=64, hidden=128, layers=2, vocab=4096)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    running = 0.0
    for j in range(ACCUM):
        loss = model(**micro_batch(model, j)).loss / ACCUM
        loss.backward()
        running += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"loss {running:.3f}")


if __name__ == "__main__":
    main()
