"""A hand-written decode loop whose KV cache is a list of per-layer tensors grown with torch.cat.

What is wrong: each decode step, every attention layer returns
``torch.cat([past_k, k_new], dim=2)`` (and the same for V) and the model
collects them into a new ``past`` list. The caller still holds the old list
until the forward returns, so at the end of every step the cache exists twice:
the whole KV of length n next to the new one of length n+1. Over 256 new tokens
the loop also allocates and copies O(n^2) bytes of KV for O(n) bytes of cache.

The fix (``manual_kv_list_concat_fixed.py``): preallocate one
``(B, H, max_len, head_dim)`` buffer per layer for K and V, write each step's K/V
in place (``buf[:, :, pos:pos + t] = k``) and attend over ``buf[:, :, :pos + t]``.
No copy of the cache is ever made; greedy outputs are the same.

Run: ``python manual_kv_list_concat.py`` or ``memwarden trace manual_kv_list_concat.py``.
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

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)  # each (B, H, t, hd)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)  # (B, H, n + t, hd): a new copy of the whole cache
            v = torch.cat([past[1], v], dim=2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=past is None)
        return self.out(a.transpose(1, 2).reshape(b, t, DIM)), (k, v)


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None):
        a, present = self.attn(self.norm1(x), past)
        x = x + a
        return x + self.mlp(self.norm2(x)), present


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]] | None = None):
        h = self.embed(ids)  # (B, t, DIM)
        presents = []
        for i, layer in enumerate(self.layers):
            h, kv = layer(h, past[i] if past is not None else None)
            presents.append(kv)
        return self.head(self.norm(h[:, -1])), presents


def main() -> None:
    torch.manual_seed(0)
    model = TinyLM().eval()
    ids = torch.randint(3, VOCAB, (BATCH, PROMPT))
    out = []
    with torch.no_grad():
        logits, past = model(ids)
        for _ in range(NEW_TOKENS):
            tok = logits.argmax(-1, keepdim=True)  # (B, 1)
            out.append(tok)
            logits, past = model(tok, past)  # the old `past` is alive until this returns: 2x KV
    print(f"generated {len(out)} tokens; first row starts {torch.cat(out, 1)[0, :8].tolist()}")


if __name__ == "__main__":
    main()
