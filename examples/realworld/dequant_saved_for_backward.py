"""LoRA on a frozen int8 base: ``F.linear(x, dequantize(W))`` saves every dequantised weight for backward.

Source: https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1935
    "fix: prevent F.linear from saving dequantized weights in MatMul4Bit/MatMul8bitLt to save
     ~13GB VRAM and prevent OOM errors
     output = F.linear(A, dequantize_4bit(B, state).to(A.dtype).t(), bias)"

The input requires grad (LoRA adapters upstream), so autograd keeps the bf16 copy of each frozen
weight alive until backward: a full-precision copy of the base model at the peak. Fix
(``_fixed``): a custom ``torch.autograd.Function`` that dequantises in forward and again in
backward, saving only the int8 weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _w8 import DTYPE, W8Stack
from torch import nn

EXPECT = "dequant-temporaries"
FIX_WORDS = ("autograd.Function",)
DIM, LAYERS, STEPS, RANK = 1024, 6, 3, 8


class W8LoraLinear(nn.Module):
    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(q, requires_grad=False)
        self.scale = nn.Parameter(scale, requires_grad=False)
        self.lora_a = nn.Parameter(torch.randn(RANK, q.shape[1], dtype=DTYPE) / 32)
        self.lora_b = nn.Parameter(torch.zeros(q.shape[0], RANK, dtype=DTYPE))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = F.linear(x, self.weight.to(x.dtype) * self.scale[:, None])  # MISTAKE
        return base + F.linear(F.linear(x, self.lora_a), self.lora_b)


def main() -> None:
    model = W8Stack(DIM, LAYERS, W8LoraLinear).train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for _step in range(STEPS):
        x = torch.randn(2, 16, DIM, dtype=DTYPE)  # (B, T, D)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(float(loss))


if __name__ == "__main__":
    main()
