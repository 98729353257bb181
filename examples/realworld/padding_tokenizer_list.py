"""Sentences padded to ``max_length`` in Python lists, then ``torch.tensor(batch)``, fed positionally.

Source: https://github.com/facebookresearch/FiD/pull/17
    "added the option pad_to_max_length, which enables to either use the max length specified, or
     compute the max length present in the batch dynamically. The default is to use the dynamic
     computation, since it is much cheaper in terms of memory consumption."

Fix: pad to the longest sentence of the batch (``padding="longest"``).
"""

from __future__ import annotations

import random

import torch
from _tiny import tiny_llama

EXPECT = "alignment-padding"
FIX_WORDS = ("longest",)
MAX_LENGTH, BATCH = 384, 8


def main() -> None:
    model = tiny_llama()
    rng = random.Random(0)
    rows = [[rng.randrange(3, 1000) for _ in range(rng.randrange(16, 48))] for _ in range(BATCH)]
    ids = torch.tensor([r + [0] * (MAX_LENGTH - len(r)) for r in rows])  # MISTAKE
    mask = torch.tensor([[1] * len(r) + [0] * (MAX_LENGTH - len(r)) for r in rows])
    with torch.no_grad():
        hidden = model.model(ids, mask).last_hidden_state  # positional: input_ids, attention_mask
    print(tuple(hidden.shape))


if __name__ == "__main__":
    main()
