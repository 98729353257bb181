"""Fixed twin of ``manual_kv_list_concat.py``: a preallocated KV buffer written in place.

One ``(B, H, max_len, head_dim)`` buffer per layer for K and for V is allocated before the
prompt is processed. Each step writes its K/V at ``pos`` (slice assignment, no new tensor) and
attends over ``buf[:, :, :pos + t]``, a view. The cache is never copied, so the peak holds one
cache, not two, and no O(n^2) allocation churn happens. Greedy outputs equal the original's.

Run: ``python manual_kv_list_concat_fixed.py`` or ``memwarden trace manual_kv_list_concat_fixed.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, LAYERS = 1024, 128, 4, 6
BATCH, PROMPT, NEW_TOKENS = 2, 64, 256
HEAD_DIM = DIM // HEADS


class KVCache:
    """Per-layer K and V buffers of the final length, filled in place."""

    def __init__(self, max_len: int) -> None:
        self.k = [torch.zeros(BATCH, HEADS, max_len, HEAD_DIM) for _ in range(LAYERS)]  # (B, H, max_len, hd)
        self.v = [torch.zeros(BATCH, HEADS, max_len, HEAD_DIM) for _ in range(LAYERS)]
        self.pos = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.pos + k.shape[2]
        self.k[layer][:, :, self.pos : end] = k
        self.v[layer][:, :, self.pos : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]  # views, no copy


class Attention(nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)  # each (B, H, t, hd)
        prefill = cache.pos == 0
        k, v = cache.update(self.index, k, v)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=prefill)
        return self.out(a.transpose(1, 2).reshape(b, t, DIM))


class Layer(nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = Attention(index)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cache)
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Layer(i) for i in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        h = self.embed(ids)  # (B, t, DIM)
        for layer in self.layers:
            h = layer(h, cache)
        cache.pos += ids.shape[1]
        return self.head(self.norm(h[:, -1]))


def main() -> None:
    torch.manual_seed(0)
    model = TinyLM().eval()
    ids = torch.randint(3, VOCAB, (BATCH, PROMPT))
    cache = KVCache(max_len=PROMPT + NEW_TOKENS)
    out = []
    with torch.no_grad():
        logits = model(ids, cache)
        for _ in range(NEW_TOKENS):
            tok = logits.argmax(-1, keepdim=True)  # (B, 1)
            out.append(tok)
            logits = model(tok, cache)
    print(f"generated {len(out)} tokens; first row starts {torch.cat(out, 1)[0, :8].tolist()}")


if __name__ == "__main__":
    main()
