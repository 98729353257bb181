"""Fixed twin of ``concat_manual_past.py``: the cache is preallocated and written in place.

Source: https://github.com/huggingface/transformers/issues/25930 ("Ideally we want the tensor that
`past_key_value[0]` is pointing to be freed"); transformers' ``StaticCache`` allocates
``(B, H, max_len, hd)`` once and ``index_copy_``s each token into it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = None
DIM, HEADS, LAYERS, PROMPT, NEW_TOKENS = 256, 4, 4, 64, 96
MAX_LEN = PROMPT + NEW_TOKENS


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.k_cache = torch.zeros(1, HEADS, MAX_LEN, DIM // HEADS)  # (B, H, max_len, hd)
        self.v_cache = torch.zeros(1, HEADS, MAX_LEN, DIM // HEADS)

    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        self.k_cache[:, :, pos : pos + t] = k
        self.v_cache[:, :, pos : pos + t] = v
        k, v = self.k_cache[:, :, : pos + t], self.v_cache[:, :, : pos + t]  # views, no copy
        y = F.scaled_dot_product_attention(q, k, v, is_causal=pos == 0)
        return x + self.out(y.transpose(1, 2).reshape(b, t, DIM))


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.blocks, self.head = (
            nn.Embedding(512, DIM),
            nn.ModuleList(Block() for _ in range(LAYERS)),
            nn.Linear(DIM, 512),
        )

    def forward(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h, pos)
        return self.head(h[:, -1])


def main() -> None:
    torch.manual_seed(0)
    model = Decoder().eval()
    ids = torch.randint(0, 512, (1, PROMPT))
    pos, out = 0, []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(ids, pos)
            pos += ids.shape[1]
            ids = logits.argmax(-1, keepdim=True)
            out.append(int(ids))
    print(out[:8])


if __name__ == "__main__":
    main()
