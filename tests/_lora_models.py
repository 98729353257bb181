"""Small PEFT models and adapter files for the LoRA and sync tests (not a test module)."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model
from peft.utils import get_peft_model_state_dict
from safetensors.torch import save

# For the LoRA tests (no hub access): a stack of linear layers, each adapted.


class Stack(torch.nn.Module):
    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def peft_stack(layers: int = 4, width: int = 32, rank: int = 4, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    targets = [f"layers.{i}" for i in range(layers)]
    return get_peft_model(
        Stack(layers, width), LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, init_lora_weights=False)
    )


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def changed(state: dict[str, torch.Tensor], layers: list[int], seed: int = 1) -> dict[str, torch.Tensor]:
    """``state`` with the LoRA tensors of ``layers`` replaced by other random values."""
    gen = torch.Generator().manual_seed(seed)
    out = dict(state)
    for name, value in state.items():
        if any(f"layers.{i}." in name for i in layers):
            out[name] = torch.randn(value.shape, generator=gen, dtype=value.dtype)
    return out


def file_of(state: dict[str, torch.Tensor]) -> bytes:
    return save({k: v.contiguous() for k, v in state.items()})
