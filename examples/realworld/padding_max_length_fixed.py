"""Fixed twin of ``padding_max_length.py``: each batch is padded to its longest sentence.

Source: https://github.com/huggingface/transformers/issues/3634 ("a custom collate function that
pads only to the longest sequence in a batch"); ``DataCollatorWithPadding(padding="longest")``.
"""

from __future__ import annotations

import numpy as np
import torch
from _tiny import tiny_llama

EXPECT = None
BATCH, BATCHES = 8, 3


def collate(rows: list[list[int]]) -> dict[str, torch.Tensor]:
    longest = max(len(r) for r in rows)
    ids = np.zeros((len(rows), longest), dtype=np.int64)
    mask = np.zeros((len(rows), longest), dtype=np.int64)
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
            logits = model(**collate(sentences(b))).logits
    print(tuple(logits.shape))


if __name__ == "__main__":
    main()
