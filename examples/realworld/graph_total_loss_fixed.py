"""Fixed twin of ``graph_total_loss.py``: the logged loss is a Python float.

Source: https://pytorch.org/docs/stable/notes/faq.html -- "You can fix this code by writing
total_loss += float(loss) instead."
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _nets import Mlp, batch

EXPECT = None
STEPS = 8


def main() -> None:
    torch.manual_seed(0)
    model = Mlp()
    total_loss = 0.0
    for step in range(STEPS):
        x, y = batch(step)
        output = model(x)
        loss = F.cross_entropy(output, y)
        total_loss += float(loss)
    print(total_loss / STEPS)


if __name__ == "__main__":
    main()
