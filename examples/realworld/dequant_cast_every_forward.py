"""An int8 weight-only layer that casts its whole weight to bf16 on every forward.

Source: https://github.com/bitsandbytes-foundation/bitsandbytes/pull/33
    "In forward pass, we have to cast row-major matrix to Turing/Ampere at each iteration. This
     leads to noticeable computational overhead for inference."
and https://github.com/huggingface/transformers/pull/35068 ("Simplifies the dequantization for
bitsandbytes int8 weights": ``weight.to(dtype) * scale``). memwarden issue 14: "an int8 layer cast
to float on every forward (1.1 GiB allocated over a run, 672 copies) is not reported when loading
sets the peak".

Loading (quantising a float checkpoint) sets the peak here; the per-forward copies never reach it
but allocate the whole weight again on every call. Fix (``_fixed``): a fused int8 kernel
(``torch._weight_int8pack_mm``) that never materialises the float weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _w8 import DTYPE, W8Stack
from torch import nn

EXPECT = "dequant-temporaries"
FIX_WORDS = ("_weight_int8pack_mm",)
DIM, LAYERS, REQUESTS = 1024, 6, 24


class W8Linear(nn.Module):
    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(q, requires_grad=False)
        self.scale = nn.Parameter(scale, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype) * self.scale[:, None])  # MISTAKE


def main() -> None:
    model = W8Stack(DIM, LAYERS, W8Linear).eval()
    with torch.inference_mode():
        for _i in range(REQUESTS):
            x = torch.randn(1, 8, DIM, dtype=DTYPE)  # (B, T, D)
            y = model(x)
    print(float(y.float().mean()))


if __name__ == "__main__":
    main()
