"""Fine-tune SpeechT5 (speech-to-text) on short voice commands.

The collator pads the raw waveforms of a batch; lengths are rounded up so the conv feature encoder
always sees "nice" sizes.
"""

import random
from dataclasses import dataclass

import torch

import _common as C

EXPECT = "alignment-padding"
FIX_WORDS = ["pad", "longest", "power of two", "pad_to_multiple_of"]

SR = 16000
BATCH = 6
STEPS = 3


@dataclass
class DataCollatorSpeechT5WithPadding:
    pad_token_id: int = C.PAD_ID

    def __call__(self, features):
        longest = max(len(f["input_values"]) for f in features)
        target = 1 << (longest - 1).bit_length()  # MISTAKE
        wav = torch.zeros(len(features), target)
        att = torch.zeros(len(features), target, dtype=torch.long)
        for i, f in enumerate(features):
            n = len(f["input_values"])
            wav[i, :n] = torch.from_numpy(f["input_values"])
            att[i, :n] = 1
        L = max(len(f["labels"]) for f in features)
        labels = torch.full((len(features), L), -100)
        for i, f in enumerate(features):
            labels[i, : len(f["labels"])] = torch.tensor(f["labels"])
        return {"input_values": wav, "attention_mask": att, "labels": labels}


def load_commands(n):
    rng = random.Random(0)
    out = []
    for i in range(n):
        secs = rng.uniform(1.1, 2.1)
        wave = C.fake_speech(secs, sr=SR, seed=i)
        text = [rng.randrange(C.FIRST_TEXT_ID, 90) for _ in range(rng.randint(6, 14))] + [C.EOS_ID]
        out.append({"input_values": wave, "labels": text})
    return out


def main():
    torch.manual_seed(0)
    model = C.speecht5_asr(hidden=128, layers=2, vocab=96)
    model.train()
    collator = DataCollatorSpeechT5WithPadding()
    data = load_commands(BATCH * STEPS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step in range(STEPS):
        batch = collator(data[step * BATCH : (step + 1) * BATCH])
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step}: loss={loss.item():.3f} samples={batch['input_values'].shape[1]}")


if __name__ == "__main__":
    main()
