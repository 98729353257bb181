"""Fixed twin of ``full_logits_scoring.py``: the model returns the last position's logits only.

Source: https://github.com/huggingface/trl/pull/2683 (``num_logits_to_keep``, now ``logits_to_keep``).
"""

from __future__ import annotations

import torch
from _tiny import prompt, tiny_llama

EXPECT = None
BATCHES = 4


def main() -> None:
    model = tiny_llama()
    choices = []
    with torch.no_grad():
        for i in range(BATCHES):
            logits = model(prompt(512, batch=4, seed=i), logits_to_keep=1).logits
            choices.append(logits[:, -1].argmax(-1))
    print(torch.stack(choices).tolist())


if __name__ == "__main__":
    main()
