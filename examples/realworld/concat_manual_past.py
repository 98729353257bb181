"""A hand-written decoder whose KV cache grows by ``torch.cat`` every step.

Source: https://github.com/huggingface/transformers/issues/1916
    "output_token, past = model.forward(output_token, past=past) ... The problem with this is that
     `past` keeps growing."
and https://github.com/huggingface/transformers/issues/25930
    "When we do `torch.cat(..)` ... we get two copies, `past_key_value[0]` one of shape
     `(bsz, heads, seq_length, head_size)` and the `key_states` of shape
     `(bsz, heads, seq_length+1, head_size)`."

Each step allocates a new key and value tensor one token longer and copies the old ones into it.
Fix (``_fixed``): preallocate the cache for the maximum length once and write each step's token
in place (what transformers' ``StaticCache`` does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "kv-concat-growth"
FIX_WORDS = ("preallocat", "StaticCache")
DIM, HEADS, LAYERS, PROMPT, NEW_TOKENS = 256, 4, 4, 64, 96


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None):  # noqa: ANN201
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)  # (B, H, T, hd) each
        if past is not None:
            k = torch.cat([past[0], k], dim=2)  # MISTAKE
            v = torch.cat([past[1], v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=past is None)
        return x + self.out(y.transpose(1, 2).reshape(b, t, DIM)), (k, v)


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.blocks, self.head = (
            nn.Embedding(512, DIM),
            nn.ModuleList(Block() for _ in range(LAYERS)),
            nn.Linear(DIM, 512),
        )

    def forward(self, ids: torch.Tensor, past: list | None = None):  # noqa: ANN201
        h, new_past = self.embed(ids), []
        for i, block in enumerate(self.blocks):
            h, kv = block(h, past[i] if past else None)
            new_past.append(kv)
        return self.head(h[:, -1]), new_past


def main() -> None:
    torch.manual_seed(0)
    model = Decoder().eval()
    ids = torch.randint(0, 512, (1, PROMPT))
    past = None
    out = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits, past = model(ids, past)
            ids = logits.argmax(-1, keepdim=True)  # (1, 1)
            out.append(int(ids))
    print(out[:8])


if __name__ == "__main__":
    main()
