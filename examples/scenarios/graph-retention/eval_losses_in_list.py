"""Validation losses kept as tensors, computed with autograd still on.

What is wrong: an audio-tagging model is trained for a few steps, then
validated. The validation loop forgets ``torch.no_grad()`` and appends each
batch's loss *tensor* to a list, to average at the end. A loss tensor that
requires grad references its autograd graph, and the graph holds every
activation the audio encoder saved for a backward that never comes. Each
validation batch therefore adds a whole graph to memory: memory grows step
over step until the list is dropped (on a long validation set: OOM).

The fix (``eval_losses_in_list_fixed.py``): validate under ``torch.no_grad()``
and keep ``loss.item()`` (a Python float). Nothing is saved for backward and
nothing outlives its batch.

Run: ``python eval_losses_in_list.py`` or ``memwarden trace eval_losses_in_list.py``.
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
    for i in range(VAL_BATCHES):
        mels, labels = batch(1000 + i)
        val_losses.append(F.cross_entropy(model(mels), labels))  # a tensor with its graph
    print(f"validation loss {torch.stack(val_losses).mean().item():.4f}")


if __name__ == "__main__":
    main()
