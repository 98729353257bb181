"""Library path: a causal-LM training loop with AdamW.

Source: https://huggingface.co/docs/transformers/main/en/training ("Train in native PyTorch")
    "outputs = model(**batch); loss = outputs.loss; loss.backward(); optimizer.step();
     lr_scheduler.step(); optimizer.zero_grad()"
No planted bug: activations live from forward to backward, AdamW state is made on the first step.
"""

from __future__ import annotations

import torch
from _tiny import prompt, tiny_llama

EXPECT = None
STEPS = 4


def main() -> None:
    model = tiny_llama(layers=2).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(STEPS):
        ids = prompt(64, batch=4, seed=step)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(step, round(loss.item(), 3))


if __name__ == "__main__":
    main()
