"""A KV cache kept as one stacked tensor for all layers, grown with torch.cat every step.

What is wrong: the decode loop keeps the cache the way an exported decoder's
``past_key_values`` input looks -- one ``(layers, 2, B, H, T, head_dim)`` tensor --
and appends each step's new K/V with ``cache = torch.cat([cache, new_kv], dim=-2)``.
That allocates a whole new cache of length T+1 while the old one of length T is
still alive: every step the peak holds the full cache twice, and over 256 steps
the loop allocates and copies O(T^2) bytes of KV.

The fix (``stacked_kv_tensor_fixed.py``): allocate the stacked cache once at its
final length and let each layer write its step's K/V in place at ``pos``
(``cache[i, 0, :, :, pos:pos + t] = k``), attending over the filled prefix.
Greedy outputs are the same.

Run: ``python stacked_kv_tensor.py`` or ``memwarden trace stacked_kv_tensor.py``.
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

    def forward(self, x: torch.Tensor, past: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``past``: (2, B, H, T, hd) view of this layer's cache or None; returns the output and this step's (2, B, H, t, hd)."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)  # each (B, H, t, hd)
        new_kv = torch.stack([k, v])  # (2, B, H, t, hd)
        if past is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # attend over past + this token without concatenating: split softmax over the two key sets
            scale = HEAD_DIM**-0.5
            s = torch.cat([q @ past[0].transpose(-1, -2), q @ k.transpose(-1, -2)], dim=-1) * scale  # (B, H, t, T + t)
            p = s.softmax(-1)
            n = past.shape[3]
            a = p[..., :n] @ past[1] + p[..., n:] @ v
        return self.out(a.transpose(1, 2).reshape(b, t, DIM)), new_kv


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor, past: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        a, new_kv = self.attn(self.norm1(x), past)
        x = x + a
        return x + self.mlp(self.norm2(x)), new_kv


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor, cache: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``cache``: (LAYERS, 2, B, H, T, hd) or None; returns logits and this step's (LAYERS, 2, B, H, t, hd)."""
        h = self.embed(ids)  # (B, t, DIM)
        new = []
        for i, layer in enumerate(self.layers):
            h, kv = layer(h, cache[i] if cache is not None else None)
            new.append(kv)
        return self.head(self.norm(h[:, -1])), torch.stack(new)


def main() -> None:
    torch.manual_seed(0)
    model = TinyLM().eval()
    ids = torch.randint(3, VOCAB, (BATCH, PROMPT))
    out = []
    with torch.no_grad():
        logits, cache = model(ids, None)  # (LAYERS, 2, B, H, PROMPT, hd)
        for _ in range(NEW_TOKENS):
            tok = logits.argmax(-1, keepdim=True)  # (B, 1)
            out.append(tok)
            logits, new_kv = model(tok, cache)
            cache = torch.cat([cache, new_kv], dim=-2)  # the mistake: a second full copy of the cache
    print(f"generated {len(out)} tokens; first row starts {torch.cat(out, 1)[0, :8].tolist()}")


if __name__ == "__main__":
    main()
