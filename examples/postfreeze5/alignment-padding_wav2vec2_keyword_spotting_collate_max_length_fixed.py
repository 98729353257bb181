import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""Fine-tuning a wav2vec2 audio classifier on Speech-Commands-style keyword clips (about 1 s each).
The collate_fn pads each batch to its longest clip (padding="longest"), as the fine-tuning guides do."""

import numpy as np
import torch

EXPECT = None

SR = 16000
KEYWORDS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go", "_unknown_", "_silence_"]


class KeywordDataset(torch.utils.data.Dataset):
    def __init__(self, n, seed=0):
        rng = np.random.default_rng(seed)
        self.items = [
            (C.fake_speech(float(rng.uniform(0.6, 1.0)), seed=seed + i), int(rng.integers(len(KEYWORDS))))
            for i in range(n)
        ]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        wave, label = self.items[i]
        return {"input_values": (wave - wave.mean()) / (wave.std() + 1e-7), "label": label}


def pad(features, padding="longest", max_length=None):
    """Wav2Vec2FeatureExtractor.pad in short: right-pad waveforms with zeros, build the attention mask."""
    lengths = [len(f["input_values"]) for f in features]
    target = max_length if padding == "max_length" else max(lengths)
    values = torch.zeros(len(features), target)
    mask = torch.zeros(len(features), target, dtype=torch.long)
    for i, f in enumerate(features):
        values[i, : lengths[i]] = torch.from_numpy(f["input_values"][:target])
        mask[i, : lengths[i]] = 1
    return {"input_values": values, "attention_mask": mask}


def collate_fn(features):
    batch = pad(features, padding="longest")
    batch["labels"] = torch.tensor([f["label"] for f in features])
    return batch


def main():
    torch.manual_seed(0)
    model = C.wav2vec2_classifier(hidden=128, layers=4, num_labels=len(KEYWORDS))
    model.freeze_feature_encoder()
    model.train()
    loader = torch.utils.data.DataLoader(KeywordDataset(16), batch_size=4, shuffle=False, collate_fn=collate_fn)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-5)
    running = 0.0
    for step, batch in enumerate(loader):
        loss = model(**batch).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        running += loss.item()
    print("mean train loss:", round(running / (step + 1), 3))


if __name__ == "__main__":
    main()
