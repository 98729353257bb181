"""A collator that pads every batch to ``max_length=512`` (built with numpy, as tokenizers do).

Source: https://github.com/huggingface/transformers/issues/3634
    "Currenty all input is padded to `max_seq_length` but in most cases the longest sequence in a
     batch is shorter than that, sometimes by a significant amount. If there is a custom collate
     function that pads only to the longest sequence in a batch, that will probably save quite
     some memory and time."
and https://github.com/huggingface/notebooks/pull/452 ("`DataCollatorWithPadding` should be
performing dynamic padding within each batch").

The padded ids and attention mask are made outside torch (numpy, then ``torch.from_numpy``); the
model's activations then cover 512 positions for sentences of 20-60 tokens. Fix (``_fixed``):
``padding="longest"`` (``DataCollatorWithPadding``).
"""

from __future__ import annotations

import numpy as np
import torch
from _tiny import tiny_llama

EXPECT = "alignment-padding"
FIX_WORDS = ("longest",)
MAX_LENGTH, BATCH, BATCHES = 512, 8, 3


def collate(rows: list[list[int]], max_length: int = MAX_LENGTH) -> dict[str, torch.Tensor]:
    ids = np.zeros((len(rows), max_length), dtype=np.int64)
    mask = np.zeros((len(rows), max_length), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}


def sentences(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 1000, rng.integers(20, 60)).tolist() for _ in range(BATCH)]


def main() -> None:
    model = tiny_llama()
    with torch.no_grad():
        for b in range(BATCHES):
            logits = model(**collate(sentences(b))).logits  # MISTAKE
    print(tuple(logits.shape))


if __name__ == "__main__":
    main()
