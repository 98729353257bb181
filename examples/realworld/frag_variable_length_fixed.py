"""Fixed twin of ``frag_variable_length.py``: lengths padded up to buckets of 128 tokens.

Source: https://github.com/facebookresearch/fairchem/pull/775 (few distinct sizes fragment less);
the allocator sees four shapes instead of 24.
"""

from __future__ import annotations

import random

import torch
from _tiny import prompt, tiny_llama

EXPECT = None
BATCHES, BUCKET = 24, 128


def lengths() -> list[int]:
    rng = random.Random(0)
    return [rng.randrange(32, 512) for _ in range(BATCHES)]


def main() -> None:
    model = tiny_llama(layers=2)
    with torch.no_grad():
        for i, n in enumerate(lengths()):
            padded = -(-n // BUCKET) * BUCKET
            logits = model(prompt(padded, batch=4, seed=i)).logits
    print(tuple(logits.shape))


if __name__ == "__main__":
    main()
