import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""A hand-rolled ASR trainer for a wav2vec2 CTC model (end2end-asr style). After each training epoch
`Trainer.validate()` runs the dev set with model.eval() but without torch.no_grad(), and adds each
batch's CTC loss tensor to a running total, so every dev batch's autograd graph (all conv and
transformer activations) stays alive until the epoch's average is printed."""

import numpy as np
import torch

EXPECT = "graph-retention"
FIX_WORDS = ("no_grad", "item()", "detach", "inference_mode")

SR = 16000


def make_split(n, seed, vocab):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        wave = C.fake_speech(float(rng.uniform(2.5, 3.0)), seed=seed * 1000 + i)
        labels = torch.from_numpy(rng.integers(1, vocab, size=int(rng.integers(10, 25))))
        out.append((wave, labels))
    return out


def collate(items):
    longest = max(len(w) for w, _ in items)
    x = torch.zeros(len(items), longest)
    for i, (w, _) in enumerate(items):
        x[i, : len(w)] = torch.from_numpy(w)
    lab_len = max(len(l) for _, l in items)
    labels = torch.full((len(items), lab_len), -100)
    for i, (_, l) in enumerate(items):
        labels[i, : len(l)] = l
    return x, labels


class Trainer:
    def __init__(self, model, train, dev, bs=4):
        self.model, self.train, self.dev, self.bs = model, train, dev, bs
        self.optim = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def batches(self, split):
        for i in range(0, len(split), self.bs):
            yield collate(split[i : i + self.bs])

    def train_epoch(self):
        self.model.train()
        for x, labels in self.batches(self.train):
            loss = self.model(x, labels=labels).loss
            loss.backward()
            self.optim.step()
            self.optim.zero_grad()

    def validate(self):
        self.model.eval()
        total_loss = 0
        for x, labels in self.batches(self.dev):
            loss = self.model(x, labels=labels).loss
            total_loss += loss  # MISTAKE
        return float(total_loss) / max(1, len(self.dev) // self.bs)


def main():
    torch.manual_seed(0)
    model = C.wav2vec2_ctc(hidden=128, layers=4, vocab=32)
    model.freeze_feature_encoder()
    trainer = Trainer(model, make_split(8, 1, 32), make_split(32, 2, 32))
    trainer.train_epoch()
    print("dev CTC loss:", round(trainer.validate(), 3))


if __name__ == "__main__":
    main()
