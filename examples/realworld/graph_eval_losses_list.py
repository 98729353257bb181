"""Validation without ``torch.no_grad()``, appending each batch's loss tensor to a list.

Source: https://theneuralbase.com/pytorch/learn/intermediate/memory-leak-detection/
    "the article correctly identifies list accumulation as a leak source ... always use .item()
     for scalar losses (loss.item() not loss)
     loss_history.append(loss.item()) # NOT loss or loss.detach()"
and https://theneuralbase.com/pytorch/learn/intermediate/evaluation-on-custom-classes/
    "The article's warning about forgotten torch.no_grad() causing silent OOM is accurate"

Fix (``_fixed``): evaluate under ``torch.no_grad()`` and keep ``loss.item()``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _nets import Mlp, batch

EXPECT = "graph-retention"
FIX_WORDS = ("no_grad", "item")
VAL_BATCHES = 8


def main() -> None:
    torch.manual_seed(0)
    model = Mlp().eval()
    losses = []
    for i in range(VAL_BATCHES):
        x, y = batch(100 + i)
        losses.append(F.cross_entropy(model(x), y))  # MISTAKE
    print(torch.stack(losses).mean().item())


if __name__ == "__main__":
    main()
