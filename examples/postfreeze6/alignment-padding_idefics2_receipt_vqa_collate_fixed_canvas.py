"""Fine-tune Idefics2 on receipt VQA (phone photos of till receipts, short answers).

Batches are built by our own collate_fn so that every step sees the same tensor shapes.
"""

import random

import torch
from torch.utils.data import DataLoader, Dataset

import _common as C

EXPECT = "alignment-padding"
FIX_WORDS = ["pad", "largest image in the batch", "longest", "pixel_attention_mask"]

CANVAS = 256  # vision_config.image_size (the processor's longest_edge)
BATCH = 8
STEPS = 3

torch.manual_seed(0)
model = C.idefics2(image_px=CANVAS, patch_px=8, vision_hidden=64, latents=16, hidden=64, layers=2, vocab=2048)
model.train()
VOCAB = model.config.text_config.vocab_size


class ReceiptVQA(Dataset):
    def __init__(self, n=BATCH * STEPS):
        rng = random.Random(0)
        self.items = []
        for i in range(n):
            h = rng.choice([64, 72, 80, 96])
            w = rng.choice([48, 56, 64])
            q = C.text_ids(rng.randint(8, 14), VOCAB - 3, seed=i)[0].tolist()
            a = C.text_ids(rng.randint(2, 5), VOCAB - 3, seed=1000 + i)[0].tolist()
            self.items.append((h, w, q, a, i))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, idx):
        h, w, q, a, seed = self.items[idx]
        img = C.normalize(C.fake_rgb(h, w, seed=seed))  # (3, h, w)
        return {"image": img, "question": q, "answer": a}


def collate(samples):
    H = W = CANVAS  # MISTAKE
    pix = torch.zeros(len(samples), 1, 3, H, W)
    pmask = torch.zeros(len(samples), 1, H, W, dtype=torch.bool)
    rows = []
    for i, s in enumerate(samples):
        _, h, w = s["image"].shape
        pix[i, 0, :, :h, :w] = s["image"]
        pmask[i, 0, :h, :w] = True
        prompt = [C.BOS_ID] + C.idefics2_image_block(model) + s["question"]
        rows.append((prompt, s["answer"] + [C.EOS_ID]))
    T = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), T), C.PAD_ID)
    labels = torch.full((len(rows), T), -100)
    att = torch.zeros(len(rows), T, dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        seq = p + a
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(p) : len(seq)] = torch.tensor(a)
        att[i, : len(seq)] = 1
    return {
        "input_ids": ids,
        "attention_mask": att,
        "labels": labels,
        "pixel_values": pix,
        "pixel_attention_mask": pmask,
    }


loader = DataLoader(ReceiptVQA(), batch_size=BATCH, shuffle=False, collate_fn=collate)
opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-4)

for step, batch in enumerate(loader):
    out = model(**batch)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} loss {out.loss.item():.3f} pixels {tuple(batch['pixel_values'].shape)}")
