"""Whisper fine-tune with gradient accumulation done the memory-friendly way (correct, memory-heavy).

What the user does: each optimizer step runs 3 micro-batches of 8 clips; the collator pads the
labels to the longest transcript of the micro-batch, every micro-batch calls ``backward()`` on
``loss / accum`` right away (gradients accumulate in ``.grad``) and only ``loss.item()`` is logged.
Training activations, gradients and AdamW state are the legitimate cost.
Sources: https://github.com/alexandrainst/coral/pull/100 ; https://github.com/lhoyer/DAFormer/issues/48 ;
https://github.com/BatsResearch/labelmodels/issues/4
Reproduction: a tiny random-weight Whisper (10 s window, 8k vocabulary); 2 optimizer steps of 3
micro-batches of 8 clips with 20-40-token transcripts.
"""

import _common as c
import torch

EXPECT = None

ACCUM = 3


def micro_batch(g: torch.Generator, seed: int) -> dict:
    feats, labels = [], []
    for i in range(8):
        feats.append(c.log_mel(c.fake_speech(8.0, seed=seed + i), n_mels=80, frames=1000))
        n = int(torch.randint(20, 41, (1,), generator=g))
        labels.append([c.BOS_ID] + torch.randint(c.FIRST_TEXT_ID, 8192, (n,), generator=g).tolist() + [c.EOS_ID])
    width = max(len(x) for x in labels)
    lab = torch.full((8, width), -100, dtype=torch.long)
    for i, x in enumerate(labels):
        lab[i, : len(x)] = torch.tensor(x)
    return {"input_features": torch.stack(feats), "labels": lab}


def main() -> None:
    model = c.whisper(d_model=128, layers=2, vocab=8192, window_s=10.0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    logged = []
    for step in range(2):
        total = 0.0
        for m in range(ACCUM):
            loss = model(**micro_batch(g, seed=100 * step + 10 * m)).loss / ACCUM
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        logged.append(total)
    print("step losses:", [round(x, 3) for x in logged])


if __name__ == "__main__":
    main()
