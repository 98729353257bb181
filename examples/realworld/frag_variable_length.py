"""Variable-length batches through a model: every batch asks the allocator for new sizes.

Source: https://github.com/facebookresearch/fairchem/pull/775
    "Expandable segments is a new cuda feature that helps with memory fragmentation during frequent
     allocations (ie: in the case of variable batch sizes)."
and https://github.com/sgl-project/SpecForge/pull/739 ("Variable-length microbatches repeatedly
request differently sized CUDA allocations. Long runs can strand large amounts of
reserved-but-unallocated memory").

Fix (``_fixed``): pad lengths to a few buckets (multiples of 128) or set
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.
"""

from __future__ import annotations

import random

import torch
from _tiny import prompt, tiny_llama

EXPECT = "fragmentation"
FIX_WORDS = ("expandable_segments",)
BATCHES = 24


def lengths() -> list[int]:
    rng = random.Random(0)
    return [rng.randrange(32, 512) for _ in range(BATCHES)]


def main() -> None:
    model = tiny_llama(layers=2)
    with torch.no_grad():
        for i, n in enumerate(lengths()):
            logits = model(prompt(n, batch=4, seed=i)).logits  # MISTAKE
    print(tuple(logits.shape))


if __name__ == "__main__":
    main()
