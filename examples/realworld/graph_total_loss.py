"""``total_loss += loss`` in a training loop keeps every step's autograd graph.

Source: https://pytorch.org/docs/stable/notes/faq.html ("My model reports cuda runtime error(2):
out of memory")
    "total_loss = 0
     for i in range(10000):
         output = model(input)
         loss = criterion(output)
         total_loss += loss
     Here, total_loss is accumulating history across your training loop."

As in the FAQ's abridged loop, the summed loss is only logged and backward() never runs on it, so
each step's graph (every activation saved for backward) stays alive. Fix (``_fixed``):
``total_loss += float(loss)`` (or ``loss.item()``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _nets import Mlp, batch

EXPECT = "graph-retention"
FIX_WORDS = ("item",)
STEPS = 8


def main() -> None:
    torch.manual_seed(0)
    model = Mlp()
    total_loss = 0
    for step in range(STEPS):
        x, y = batch(step)
        output = model(x)
        loss = F.cross_entropy(output, y)
        total_loss += loss  # MISTAKE
    print(float(total_loss) / STEPS)


if __name__ == "__main__":
    main()
