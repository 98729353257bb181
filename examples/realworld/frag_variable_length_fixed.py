"""Fixed twin of ``frag_variable_length.py``: every batch padded to one static length.

Source: https://github.com/facebookresearch/fairchem/pull/775 (variable batch sizes fragment the
allocator; fixed shapes let cached blocks be reused) and
https://github.com/sgl-project/SpecForge/pull/739 (variable-length microbatches strand
reserved-but-unallocated memory). The allocator sees one shape instead of 24, so every batch reuses
the blocks the first one cached. Replayed through the allocator model, buckets of 128 tokens
(four shapes) still reserve as much as 24 random lengths on this model (docs/diagnose-accuracy.md,
calibration): one static shape is the padding that removes the stranded memory here.
"""

from __future__ import annotations

import random

import torch
from _tiny import prompt, tiny_llama

EXPECT = None
BATCHES, STATIC_LENGTH = 24, 512


def lengths() -> list[int]:
    rng = random.Random(0)
    return [rng.randrange(32, 512) for _ in range(BATCHES)]


def main() -> None:
    model = tiny_llama(layers=2)
    with torch.no_grad():
        for i, _n in enumerate(lengths()):
            logits = model(prompt(STATIC_LENGTH, batch=4, seed=i)).logits
    print(tuple(logits.shape))


if __name__ == "__main__":
    main()
