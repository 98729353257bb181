"""Inference outputs collected in a list with autograd on: each keeps its graph.

Source: https://mljourney.com/pytorch-cuda-out-of-memory-causes-solutions-and-best-practices
    "4. Storing Outputs or Intermediate Tensors - Keeping outputs in lists or dictionaries without
     detach() can cause memory retention.
     5. Not Using torch.no_grad() During Inference - Autograd tracks gradients by default."

Fix (``_fixed``): run prediction under ``torch.no_grad()`` (or ``torch.inference_mode()``).
"""

from __future__ import annotations

import torch
from _nets import Mlp, batch

EXPECT = "graph-retention"
FIX_WORDS = ("no_grad",)
BATCHES = 8


def main() -> None:
    torch.manual_seed(0)
    model = Mlp().eval()
    predictions = []
    for i in range(BATCHES):
        x, _ = batch(200 + i)
        predictions.append(model(x).softmax(-1))  # MISTAKE
    print(torch.cat(predictions).argmax(-1)[:8].tolist())


if __name__ == "__main__":
    main()
