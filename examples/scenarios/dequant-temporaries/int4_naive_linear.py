"""A hand-written int4 linear that dequantises its whole weight on every call.

What is wrong: a small recurrent language model is served from a pre-quantised int4
checkpoint (two 4-bit values packed per uint8 byte, per-group scales and zero
points, the GPTQ/AWQ layout). Its ``Int4Linear.forward`` unpacks the nibbles,
converts the *whole* weight to float32 and applies scales and zeros before an
ordinary matmul -- on every call, for every decoded token. Each call
materialises two or three float32 copies of the weight (8x the packed bytes
each), so the peak is set by short-lived dequantised weights, not by the
model: the 4-bit checkpoint buys nothing at the peak.

The fix (``int4_naive_linear_fixed.py``): keep the weight packed in the layout
of PyTorch's fused int4 kernel and call
``torch.ops.aten._weight_int4pack_mm_for_cpu`` (``torch._weight_int4pack_mm``
on CUDA), which dequantises tile by tile inside the matmul; no full-size float
weight ever exists.

Run: ``python int4_naive_linear.py`` or ``memwarden trace int4_naive_linear.py``.
"""

from __future__ import annotations

import torch
from torch import nn

DIM, FFN, VOCAB, LAYERS = 1024, 4096, 512, 2
GROUP = 64  # int4 quantisation group along the input dimension
PROMPT, NEW_TOKENS = 4, 4


class Int4Linear(nn.Module):
    """Weight-only int4 linear: packed (out, in/2) uint8 weight, per-group scales and zeros."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        groups = in_features // GROUP
        # A pre-quantised checkpoint (random here): two 4-bit values per byte.
        self.register_buffer("qweight", torch.randint(0, 256, (out_features, in_features // 2), dtype=torch.uint8))
        self.register_buffer("scales", torch.rand(out_features, groups) * 0.02)  # (N, K/G)
        self.register_buffer("zeros", torch.full((out_features, groups), 8.0))  # (N, K/G)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, k = self.out_features, self.in_features
        low, high = self.qweight & 0x0F, self.qweight >> 4
        q = torch.stack([low, high], dim=-1).reshape(n, k // GROUP, GROUP)  # (N, K/G, G) uint8
        w = (q.float() - self.zeros[..., None]) * self.scales[..., None]  # whole weight in float32
        return x @ w.reshape(n, k).t()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = Int4Linear(DIM, FFN)
        self.down = Int4Linear(FFN, DIM)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.down(torch.relu(self.up(h)))


class Int4LM(nn.Module):
    """A small recurrent LM (a stand-in for RWKV/Mamba-style models): one token per call, a running state."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.lm_head = Int4Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        state = 0.9 * state + self.embed_tokens(ids)  # (B, 1, DIM)
        h = state
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(h[:, -1]), state  # (B, VOCAB) next-token logits


def main() -> None:
    torch.manual_seed(0)
    model = Int4LM().eval()
    prompt = torch.randint(0, VOCAB, (1, PROMPT)).tolist()[0]
    state = torch.zeros(1, 1, DIM)
    generated: list[int] = []
    with torch.inference_mode():
        for token in prompt:  # prefill, one token per call
            logits, state = model(torch.tensor([[token]]), state)
        for _ in range(NEW_TOKENS):  # greedy decoding
            generated.append(int(logits.argmax(-1)))
            logits, state = model(torch.tensor([generated[-1:]]), state)
    print("generated", generated)


if __name__ == "__main__":
    main()
