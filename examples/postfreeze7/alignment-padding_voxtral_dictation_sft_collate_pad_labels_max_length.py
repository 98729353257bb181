"""Voxtral fine-tune for medical dictation (short voice notes, 4-9 s each, one 30 s window).

The collator builds [audio tokens][instruction][transcript] rows and pads the transcript side to a
fixed MAX_TEXT_TOKENS (the longest transcript the tokenizer config allows) instead of the batch's
longest row: each ~25-token transcript is padded to 512 tokens, and the language model runs and
computes an 8k-way loss over all of them.
"""

import torch

import _common as C

EXPECT = "alignment-padding"
FIX_WORDS = ["padding", "longest", "max_length", "pad"]

MAX_TEXT_TOKENS = 512
BATCH = 4
STEPS = 2

torch.manual_seed(0)
model = C.voxtral(audio_hidden=64, audio_layers=2, hidden=128, layers=4, vocab=8192)
model.train()
vocab = model.config.text_config.vocab_size
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
n_audio = C.voxtral_tokens_per_window(model)


def note(i: int) -> dict:
    wave = C.fake_speech(4.0 + i % 6, seed=i)
    text = C.text_ids(20 + i % 9, vocab - 1, seed=100 + i)[0].tolist()
    return {"features": C.voxtral_features(wave), "text": text}


def collate(items):
    head = [C.BOS_ID] + [model.config.audio_token_id] * n_audio + C.tokenize("[/INST] Transcribe.", vocab - 1)
    rows = [head + it["text"] + [C.EOS_ID] for it in items]
    width = len(head) + MAX_TEXT_TOKENS  # MISTAKE
    ids = torch.full((len(rows), width), C.PAD_ID)
    labels = torch.full((len(rows), width), -100)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        labels[i, len(head) : len(r)] = torch.tensor(r[len(head) :])
    return {
        "input_ids": ids,
        "attention_mask": (ids != C.PAD_ID).long(),
        "labels": labels,
        "input_features": torch.cat([it["features"] for it in items]),
    }


if __name__ == "__main__":
    for step in range(STEPS):
        batch = collate([note(step * BATCH + j) for j in range(BATCH)])
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(step, round(loss.item(), 3), tuple(batch["input_ids"].shape))
