"""CLIP fine-tune on product photos + titles with "gradient accumulation" done by hand: the user wants
an effective batch of 256 pairs but can only afford 32 at a time.

Each micro-batch's loss is backpropagated right away (gradients accumulate in .grad) and only its
float value is kept, so one micro-batch graph is alive at a time.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch
import torch.nn.functional as F

EXPECT = None
FIX_WORDS = ["backward", "each micro-batch", "accumulate gradients"]

MICRO_BATCH = 16
ACCUM_STEPS = 4
TEXT_LEN = 32


def micro_batches(vocab, step):
    for j in range(ACCUM_STEPS):
        g = torch.Generator().manual_seed(1000 * step + j)
        pixel_values = torch.randn(MICRO_BATCH, 3, 96, 96, generator=g)
        input_ids = torch.randint(C.FIRST_TEXT_ID, vocab, (MICRO_BATCH, TEXT_LEN), generator=g)
        input_ids[:, -1] = C.EOS_ID
        yield pixel_values, input_ids


def clip_loss(model, pixel_values, input_ids):
    out = model(pixel_values=pixel_values, input_ids=input_ids, return_loss=False)
    logits = out.logits_per_image
    target = torch.arange(logits.shape[0])
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def train_step(model, optimizer, step):
    optimizer.zero_grad(set_to_none=True)
    total_loss = 0.0
    for pixel_values, input_ids in micro_batches(model.config.text_config.vocab_size, step):
        loss = clip_loss(model, pixel_values, input_ids) / ACCUM_STEPS
        loss.backward()  # gradients accumulate in .grad; the graph is freed here
        total_loss += loss.item()
    optimizer.step()
    return float(total_loss)


def main():
    model = C.clip(image_px=96, patch_px=8, hidden=128, layers=3, vocab=4096)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step in range(1):
        print(f"step {step} loss {train_step(model, optimizer, step):.4f}")


if __name__ == "__main__":
    main()
