"""A W8A16 linear (int8 weight, bf16 scale per output channel) and a small MLP stack built on it."""

from __future__ import annotations

import torch
from torch import nn

DTYPE = torch.bfloat16


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel absmax int8 quantisation of a float (out, in) weight."""
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127  # (out,)
    return (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale.to(DTYPE)


class W8Stack(nn.Module):
    """``layers`` W8 linears of ``dim`` x ``dim``; ``linear`` decides how each multiplies."""

    def __init__(self, dim: int, layers: int, linear: type[nn.Module]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(linear(*quantize(torch.randn(dim, dim) / dim**0.5)) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return x
