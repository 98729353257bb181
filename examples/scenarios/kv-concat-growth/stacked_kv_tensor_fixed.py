"""Fixed twin of ``stacked_kv_tensor.py``: the stacked cache is allocated once and written in place.

The ``(layers, 2, B, H, max_len, head_dim)`` cache is allocated at its final length before the
prompt runs. Each layer writes its step's K/V at ``pos`` with slice assignment and attends over
``cache[i, :, :, :, :pos + t]``, a view: no step ever copies the cache, so the peak holds it
once and the O(T^2) allocation churn is gone. Greedy outputs equal the original's.

Run: ``python stacked_kv_tensor_fixed.py`` or ``memwarden trace stacked_kv_tensor_fixed.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, LAYERS = 1024, 128, 4, 6
BATCH, PROMPT, NEW_TOKENS = 2, 64, 256
HEAD_DIM = DIM // HEADS


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor, cache: torch.Tensor, pos: int) -> torch.Tensor:
        """``cache``: this layer's (2, B, H, max_len, hd) slice of the preallocated cache."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)  # each (B, H, t, hd)
        cache[0, :, :, pos : pos + t] = k  # written in place, no new cache
        cache[1, :, :, pos : pos + t] = v
        keys, values = cache[0, :, :, : pos + t], cache[1, :, :, : pos + t]  # views (B, H, pos + t, hd)
        a = F.scaled_dot_product_attention(q, keys, values, is_causal=pos == 0)
        return self.out(a.transpose(1, 2).reshape(b, t, DIM))


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor, cache: torch.Tensor, pos: int) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cache, pos)
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor, cache: torch.Tensor, pos: int) -> torch.Tensor:
        """``cache``: (LAYERS, 2, B, H, max_len, hd), filled up to ``pos``; returns next-token logits."""
        h = self.embed(ids)  # (B, t, DIM)
        for i, layer in enumerate(self.layers):
            h = layer(h, cache[i], pos)
        return self.head(self.norm(h[:, -1]))


def main() -> None:
    torch.manual_seed(0)
    model = TinyLM().eval()
    ids = torch.randint(3, VOCAB, (BATCH, PROMPT))
    out = []
    cache = torch.zeros(LAYERS, 2, BATCH, HEADS, PROMPT + NEW_TOKENS, HEAD_DIM)  # allocated once
    with torch.no_grad():
        logits = model(ids, cache, 0)
        for step in range(NEW_TOKENS):
            tok = logits.argmax(-1, keepdim=True)  # (B, 1)
            out.append(tok)
            logits = model(tok, cache, PROMPT + step)
    print(f"generated {len(out)} tokens; first row starts {torch.cat(out, 1)[0, :8].tolist()}")


if __name__ == "__main__":
    main()
