"""Fixed twin of ``graph_outputs_list.py``: predictions under ``torch.inference_mode()``.

Source: https://mljourney.com/pytorch-cuda-out-of-memory-causes-solutions-and-best-practices
("Not Using torch.no_grad() During Inference"). The outputs are still all kept: that is the
program's result, not a retained graph.
"""

from __future__ import annotations

import torch
from _nets import Mlp, batch

EXPECT = None
BATCHES = 8


def main() -> None:
    torch.manual_seed(0)
    model = Mlp().eval()
    predictions = []
    with torch.inference_mode():
        for i in range(BATCHES):
            x, _ = batch(200 + i)
            predictions.append(model(x).softmax(-1))
    print(torch.cat(predictions).argmax(-1)[:8].tolist())


if __name__ == "__main__":
    main()
