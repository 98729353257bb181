"""Fixed twin of ``int4_naive_linear.py``: PyTorch's fused int4 matmul.

The weight stays packed (``(out, in/2)`` uint8, the layout that
``torch.ops.aten._convert_weight_to_int4pack_for_cpu`` produces) with scales
and zeros in one ``(in/G, out, 2)`` tensor, and every call goes through
``torch.ops.aten._weight_int4pack_mm_for_cpu`` (``torch._weight_int4pack_mm``
on CUDA). The kernel dequantises small tiles in registers while it
multiplies: no float copy of the weight is ever allocated, so the peak is the
packed weights plus activations.

Run: ``python int4_naive_linear_fixed.py`` or ``memwarden trace int4_naive_linear_fixed.py``.
"""

from __future__ import annotations

import torch
from torch import nn

DIM, FFN, VOCAB, LAYERS = 1024, 4096, 512, 2
GROUP = 64  # int4 quantisation group along the input dimension
PROMPT, NEW_TOKENS = 4, 4


class Int4Linear(nn.Module):
    """Weight-only int4 linear on PyTorch's fused CPU kernel."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        groups = in_features // GROUP
        # A pre-quantised checkpoint (random here), already in the kernel's packed layout.
        self.register_buffer("qweight", torch.randint(0, 256, (out_features, in_features // 2), dtype=torch.uint8))
        scales_and_zeros = torch.empty(groups, out_features, 2)  # (K/G, N, [scale, zero])
        scales_and_zeros[..., 0] = torch.rand(groups, out_features) * 0.02
        scales_and_zeros[..., 1] = 0.0
        self.register_buffer("scales_and_zeros", scales_and_zeros)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)  # (B*T, K)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.qweight, GROUP, self.scales_and_zeros)
        return out.reshape(*x.shape[:-1], self.out_features)


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
