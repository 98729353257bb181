import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""Fine-tuning a BLIP captioner on a small in-house dataset with gradient accumulation: each
micro-batch of 8 image-caption pairs calls backward right away, the optimiser steps every 4
micro-batches, and only loss.item() is logged."""

import torch

EXPECT = None


def make_batches(model, n_batches, bs=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.text_config.vocab_size
    for _ in range(n_batches):
        pixels = C.normalize_float(torch.rand(bs, 3, 96, 96, generator=g))
        ids = torch.randint(C.FIRST_TEXT_ID, vocab, (bs, 20), generator=g)
        ids[:, 0] = C.BOS_ID
        yield pixels, ids


def main():
    torch.manual_seed(0)
    model = C.blip_captioner(image_px=96, patch_px=8, hidden=128, layers=4, vocab=4096)
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-5)
    accum, log = 4, []
    for step, (pixels, ids) in enumerate(make_batches(model, 8)):
        loss = model(pixel_values=pixels, input_ids=ids, labels=ids).loss / accum
        loss.backward()
        log.append(loss.item())
        if (step + 1) % accum == 0:
            optim.step()
            optim.zero_grad(set_to_none=True)
    print("mean loss:", round(sum(log) / len(log), 4))


if __name__ == "__main__":
    main()
