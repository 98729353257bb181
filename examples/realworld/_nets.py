"""Small plain-PyTorch networks shared by the corpus' training cases."""

from __future__ import annotations

import torch
from torch import nn

FEATURES, WIDTH, CLASSES, BATCH = 256, 1024, 10, 64


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(FEATURES, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH)
        )
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))  # (B, CLASSES)


def batch(seed: int, rows: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, FEATURES, generator=gen), torch.randint(0, CLASSES, (rows,), generator=gen)
