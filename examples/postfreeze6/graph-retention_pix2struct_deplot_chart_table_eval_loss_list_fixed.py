"""DePlot-style chart-to-table fine-tuning on Pix2Struct: the periodic evaluation pass over the
validation charts (linearised data tables as targets)."""

import random

import torch

import _common as C

EXPECT = None

MAX_PATCHES = 512
VAL_CHARTS = 16
BATCH = 4


def make_split(n, seed):
    rng = random.Random(seed)
    charts = []
    for i in range(n):
        h, w = rng.choice([(300, 400), (480, 640), (360, 640)])
        img = C.normalize(C.fake_rgb(h, w, seed=seed * 1000 + i))
        fp, mask = C.pix2struct_patches(img, MAX_PATCHES)
        table = [rng.randrange(C.FIRST_TEXT_ID, 2000) for _ in range(rng.randint(40, 64))] + [C.EOS_ID]
        charts.append((fp, mask, table))
    return charts


def batches(split, bs):
    for i in range(0, len(split), bs):
        chunk = split[i : i + bs]
        L = max(len(t) for _, _, t in chunk)
        labels = torch.full((len(chunk), L), -100)
        for j, (_, _, t) in enumerate(chunk):
            labels[j, : len(t)] = torch.tensor(t)
        yield {
            "flattened_patches": torch.stack([c[0] for c in chunk]),
            "attention_mask": torch.stack([c[1] for c in chunk]),
            "labels": labels,
        }


def evaluate(model, val_split):
    model.eval()
    val_losses = []
    for batch in batches(val_split, BATCH):
        out = model(**batch)
        val_losses.append(out.loss.item())
    model.train()
    return sum(float(l) for l in val_losses) / len(val_losses)


def main():
    torch.manual_seed(0)
    model = C.pix2struct(hidden=128, layers=2, vocab=2048)
    val_split = make_split(VAL_CHARTS, seed=1)
    val_loss = evaluate(model, val_split)
    print(f"validation loss {val_loss:.3f} over {len(val_split)} charts")


if __name__ == "__main__":
    main()
