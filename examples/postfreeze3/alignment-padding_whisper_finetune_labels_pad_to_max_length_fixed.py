"""Fixed twin: the collator pads the labels to the longest transcript of the batch.

What the user did: in a Whisper fine-tuning recipe the collator tokenizes each batch's transcripts
with ``padding="max_length"`` and the model's ``max_length`` (448 target positions), a setting kept
from a multi-GPU workaround. Transcripts of 20-40 tokens are padded to 448, so the decoder, its
cross-attention and the full-vocabulary logits and loss run over 448 positions per sample.
Answer in the source: stop forcing ``max_length`` padding (the block was commented out) and pad each
batch to its longest sequence, ``padding="longest"``; the Qwen fine-tuning report makes the same point
(padding every batch to max length wastes memory).
Sources: https://github.com/alexandrainst/coral/pull/100 ; https://github.com/QwenLM/Qwen3/issues/801
Reproduction: a tiny random-weight Whisper (10 s window, 8k vocabulary); 3 training steps on
batches of 6 clips whose transcripts (20-40 tokens) are padded to the longest one.
"""

import _common as c
import torch

EXPECT = None

MAX_TARGET = 448


def collate(features: list[dict], padding: str) -> dict:
    """Stack the mel windows; pad the label ids like ``tokenizer.pad`` and mask the padding with -100."""
    width = MAX_TARGET if padding == "max_length" else max(len(f["labels"]) for f in features)
    labels = torch.full((len(features), width), -100, dtype=torch.long)
    for i, f in enumerate(features):
        labels[i, : len(f["labels"])] = torch.tensor(f["labels"])
    return {"input_features": torch.stack([f["input_features"] for f in features]), "labels": labels}


def main() -> None:
    model = c.whisper(d_model=128, layers=2, vocab=8192, window_s=10.0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    losses = []
    for step in range(3):
        feats = []
        for i in range(6):
            wave = c.fake_speech(8.0, seed=10 * step + i)
            n = int(torch.randint(20, 41, (1,), generator=g))
            ids = [c.BOS_ID] + torch.randint(c.FIRST_TEXT_ID, 8192, (n,), generator=g).tolist() + [c.EOS_ID]
            feats.append({"input_features": c.log_mel(wave, n_mels=80, frames=1000), "labels": ids})
        batch = collate(feats, padding="longest")
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    print("labels width", batch["labels"].shape[1], "losses", [round(x, 3) for x in losses])


if __name__ == "__main__":
    main()
