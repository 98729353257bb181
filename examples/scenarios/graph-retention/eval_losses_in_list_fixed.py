"""Fixed twin of ``eval_losses_in_list.py``: validate under no_grad, keep floats.

``torch.no_grad()`` stops autograd from saving activations during
validation, and ``loss.item()`` keeps a Python float instead of a tensor that
references a graph. Each validation batch's memory is freed as soon as the
batch is done; memory stays flat over the validation set.

Run: ``python eval_losses_in_list_fixed.py`` or ``memwarden trace eval_losses_in_list_fixed.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MEL_BINS, FRAMES, CLASSES = 80, 400, 50
BATCH = 16
TRAIN_STEPS, VAL_BATCHES = 2, 6


class AudioTagger(nn.Module):
    def __init__(self, width: int = 512) -> None:
        super().__init__()
        self.audio_encoder = nn.Sequential(
            nn.Linear(MEL_BINS, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)
        )
        self.classifier = nn.Linear(width, CLASSES)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        frames = self.audio_encoder(mels)  # (B, FRAMES, W)
        return self.classifier(frames.mean(dim=1))  # (B, CLASSES)


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mels = torch.randn(BATCH, FRAMES, MEL_BINS, generator=gen)  # (B, FRAMES, MEL_BINS)
    labels = torch.randint(0, CLASSES, (BATCH,), generator=gen)
    return mels, labels


def main() -> None:
    torch.manual_seed(0)
    model = AudioTagger()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for step in range(TRAIN_STEPS):
        mels, labels = batch(step)
        loss = F.cross_entropy(model(mels), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    model.eval()
    val_losses = []
    with torch.no_grad():
        for i in range(VAL_BATCHES):
            mels, labels = batch(1000 + i)
            val_losses.append(F.cross_entropy(model(mels), labels).item())  # a float
    print(f"validation loss {sum(val_losses) / len(val_losses):.4f}")


if __name__ == "__main__":
    main()
