"""Fine-tune GIT on TextCaps-style captions: batch 16 split into micro-batches of 4, backward per
micro-batch (gradient accumulation), the logged loss is a float."""

import torch

import _common as C

EXPECT = None
MICRO, ACCUM, STEPS = 4, 4, 2


def micro_batch(step, k):
    seed = step * 100 + k * 10
    pix = torch.stack([C.resize(C.normalize(C.fake_rgb(240, 320, seed=seed + i)), 160, 160) for i in range(MICRO)])
    ids = torch.cat([torch.full((MICRO, 1), C.BOS_ID), C.text_ids(MICRO * 24, 2000, seed=seed).view(MICRO, 24)], dim=1)
    return pix, ids


def main():
    torch.manual_seed(0)
    model = C.git_captioner(image_px=160, patch_px=16, vision_hidden=128, hidden=128, layers=4, vocab=2048)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    for step in range(STEPS):
        running = 0.0
        for k in range(ACCUM):
            pix, ids = micro_batch(step, k)
            loss = model(pixel_values=pix, input_ids=ids, labels=ids).loss / ACCUM
            loss.backward()
            running += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step}: loss {running:.3f}")


if __name__ == "__main__":
    main()
