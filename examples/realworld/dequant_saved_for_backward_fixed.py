"""Fixed twin of ``dequant_saved_for_backward.py``: dequantise in forward and again in backward.

Source: https://github.com/bitsandbytes-foundation/bitsandbytes/pull/33 ("In backward pass, we
transform row-major weight matrix to the fp16 weights and perform fp16 matmul ... we do not store
fp16 weights and just efficiently compute them on the fly") and PR #1935.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _w8 import DTYPE, W8Stack
from torch import nn

EXPECT = None
DIM, LAYERS, STEPS, RANK = 1024, 6, 3, 8


class Int8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, q, scale):  # noqa: ANN001, ANN205
        ctx.save_for_backward(q, scale)  # int8 weight only
        return F.linear(x, q.to(x.dtype) * scale[:, None])

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        q, scale = ctx.saved_tensors
        return grad @ (q.to(grad.dtype) * scale[:, None]), None, None


class W8LoraLinear(nn.Module):
    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(q, requires_grad=False)
        self.scale = nn.Parameter(scale, requires_grad=False)
        self.lora_a = nn.Parameter(torch.randn(RANK, q.shape[1], dtype=DTYPE) / 32)
        self.lora_b = nn.Parameter(torch.zeros(q.shape[0], RANK, dtype=DTYPE))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Int8Matmul.apply(x, self.weight, self.scale) + F.linear(F.linear(x, self.lora_a), self.lora_b)


def main() -> None:
    model = W8Stack(DIM, LAYERS, W8LoraLinear).train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for _step in range(STEPS):
        x = torch.randn(2, 16, DIM, dtype=DTYPE)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(float(loss))


if __name__ == "__main__":
    main()
