"""Fixed twin of ``graph_eval_losses_list.py``: ``torch.no_grad()`` and ``loss.item()``.

Source: https://theneuralbase.com/pytorch/learn/intermediate/memory-leak-detection/
    "loss_history.append(loss.item()) # NOT loss or loss.detach()"
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _nets import Mlp, batch

EXPECT = None
VAL_BATCHES = 8


def main() -> None:
    torch.manual_seed(0)
    model = Mlp().eval()
    losses = []
    with torch.no_grad():
        for i in range(VAL_BATCHES):
            x, y = batch(100 + i)
            losses.append(F.cross_entropy(model(x), y).item())
    print(sum(losses) / len(losses))


if __name__ == "__main__":
    main()
