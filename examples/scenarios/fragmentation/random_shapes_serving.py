"""A serving loop that runs every request at its own batch size and length.

What is wrong: a text encoder behind an embedding service takes requests as
they come: each one has a different batch size (1-8) and sequence length
(16-512 tokens), and the loop runs each at its exact shape. On a CUDA device
the caching allocator keeps freed blocks for reuse, but a block cached for
one shape rarely fits the next: a larger request needs a fresh segment, a
smaller one splits a cached block and leaves odd-sized remainders. Reserved
memory climbs far above what is ever allocated at once, and a long-running
server dies of "CUDA out of memory" with plenty of memory nominally free.

The fix (``random_shapes_serving_fixed.py``): pad every request to a few
fixed shapes (batch padded to 8 rows, length bucketed to 256 or 512), so the
same block sizes come back and the cache reuses them. Alternatively set
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``; ``memwarden diagnose``
compares both under its model of the allocator.

Run: ``python random_shapes_serving.py`` or ``memwarden trace random_shapes_serving.py``.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from torch import nn

DIM, HEADS, VOCAB = 64, 8, 4096
REQUESTS = 24


class TextEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(ids)  # (B, T, DIM)
        b, t, _ = h.shape
        q, k, v = self.qkv(h).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, hd)
        scores = (q @ k.transpose(-1, -2)).masked_fill(~mask[:, None, None, :], float("-inf"))  # (B, H, T, T)
        h = h + self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, DIM))
        h = h + self.down(F.relu(self.up(h)))
        return (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)  # (B, DIM) mean over real tokens


def main() -> None:
    torch.manual_seed(0)
    model = TextEncoder().eval()
    rng = random.Random(0)
    with torch.inference_mode():
        for _ in range(REQUESTS):
            batch, length = rng.randint(1, 8), rng.randint(16, 512)  # whatever the clients sent
            ids = torch.randint(0, VOCAB, (batch, length))
            mask = torch.ones(batch, length, dtype=torch.bool)
            embeddings = model(ids, mask)
    print("last batch", tuple(embeddings.shape))


if __name__ == "__main__":
    main()
