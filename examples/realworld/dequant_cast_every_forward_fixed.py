"""Fixed twin of ``dequant_cast_every_forward.py``: the fused int8 weight-only matmul.

Source: https://github.com/bitsandbytes-foundation/bitsandbytes/pull/33 (multiply by the int8
weight without keeping a float copy); PyTorch's ``torch._weight_int8pack_mm(x, w_int8, scale)``
applies the per-channel scale to the output, so no float weight is ever allocated.
"""

from __future__ import annotations

import torch
from _w8 import DTYPE, W8Stack
from torch import nn

EXPECT = None
DIM, LAYERS, REQUESTS = 1024, 6, 24


class W8Linear(nn.Module):
    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(q, requires_grad=False)
        self.scale = nn.Parameter(scale, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (B*T, D)
        return torch._weight_int8pack_mm(flat, self.weight, self.scale).view(*x.shape[:-1], -1)


def main() -> None:
    model = W8Stack(DIM, LAYERS, W8Linear).eval()
    with torch.inference_mode():
        for _i in range(REQUESTS):
            x = torch.randn(1, 8, DIM, dtype=DTYPE)
            y = model(x)
    print(float(y.float().mean()))


if __name__ == "__main__":
    main()
