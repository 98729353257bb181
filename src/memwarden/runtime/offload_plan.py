"""Which weights :mod:`memwarden.runtime.offload` streams: the model's weight groups, what each may
stream (tied and parent-read tensors stay resident), and the placement that keeps the rest under a
budget. Changes nothing in the model."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import psutil
import torch

from memwarden.models.device_profile import MemoryTier
from memwarden.plan.placement import Placement, WeightGroup, place
from memwarden.record.modality import ModalityRules
from memwarden.trace.model import Modality

__all__ = [
    "ALIGN_BYTES",
    "READ_BY_PARENT",
    "aligned",
    "default_tiers",
    "nan_placeholder",
    "plan_streaming",
    "streamable_params",
    "weight_groups",
]

ALIGN_BYTES = 64  # what PyTorch's CPU allocator gives a fresh tensor; kernels see the same alignment
# Modules whose weights their parent's forward reads directly, never calling them, so no hook of
# theirs can bring the weights in: Whisper-style audio encoders (Qwen2-Audio, Whisper) read
# `embed_positions.weight`. They stay resident. Others show up as NaN outputs (see nan_placeholder).
READ_BY_PARENT = ("embed_positions",)
_ONCE_PER_REQUEST = (Modality.VISION, Modality.AUDIO, Modality.FUSION)  # encoders and projectors


def weight_groups(model: torch.nn.Module, *, split_layers: bool = False) -> list[tuple[str, torch.nn.Module]]:
    """The model's weight groups in registration order: disjoint module subtrees that cover every
    parameter and buffer. A group is a module with tensors of its own (a linear, an embedding, a
    norm) or a leaf; with ``split_layers=False`` an element of a ModuleList/ModuleDict (a whole
    decoder layer) is one group."""
    out: list[tuple[str, torch.nn.Module]] = []

    def visit(prefix: str, module: torch.nn.Module, is_layer: bool) -> None:
        own = any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False))
        children = list(module.named_children())
        if (is_layer and not split_layers) or own or not children:
            if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
                out.append((prefix, module))
            return
        container = isinstance(module, torch.nn.ModuleList | torch.nn.ModuleDict)
        for name, child in children:
            visit(f"{prefix}.{name}" if prefix else name, child, container)

    visit("", model, False)
    return out


def streamable_params(groups: list[tuple[str, torch.nn.Module]]) -> dict[str, list[tuple[str, torch.nn.Parameter]]]:
    """Per group, the parameters it may stream: those no other group uses (a tied parameter is
    in two groups) of a module no parent reads directly (READ_BY_PARENT). The rest stay resident."""
    uses = Counter(id(p) for _, module in groups for p in module.parameters())  # each module lists a tensor once
    return {
        name: [(k, p) for k, p in module.named_parameters() if uses[id(p)] == 1]
        if name.rsplit(".", 1)[-1] not in READ_BY_PARENT
        else []
        for name, module in groups
    }


def _specs(model: torch.nn.Module, split_layers: bool) -> list[WeightGroup]:
    rules = ModalityRules()
    groups = weight_groups(model, split_layers=split_layers)
    streamable = streamable_params(groups)
    counted: set[int] = set()  # tied tensors are pinned in every group that uses them; count them once
    specs = []
    for order, (name, module) in enumerate(groups):
        streamable_ids = {id(p) for _, p in streamable[name]}
        pinned_bytes = 0
        for t in list(module.parameters()) + list(module.buffers()):
            if id(t) not in streamable_ids and id(t) not in counted:
                counted.add(id(t))
                pinned_bytes += t.nbytes
        specs.append(
            WeightGroup(
                name=name,
                weight_bytes=sum(aligned(p.nbytes) for _, p in streamable[name]),  # as laid out in a slot
                order=order,
                per_token=rules.modality_of(name) not in _ONCE_PER_REQUEST,
                pinned_bytes=pinned_bytes,
            )
        )
    return specs


def default_tiers(offload_dir: str | os.PathLike[str]) -> tuple[MemoryTier, ...]:
    """This machine as a CPU-only device: host memory and the disk holding ``offload_dir``.
    Bandwidths are rough assumptions (dual-channel DDR, NVMe) that only feed
    ``predicted_stream_us_per_token``; pass a device profile's tiers to plan for real hardware."""
    path = Path(offload_dir)
    while not path.exists():
        path = path.parent
    return (
        MemoryTier(name="host", capacity_bytes=psutil.virtual_memory().total, bandwidth_gbps=20.0, latency_us=0.1),
        MemoryTier(name="disk", capacity_bytes=shutil.disk_usage(path).free, bandwidth_gbps=2.0, latency_us=100.0),
    )


def plan_streaming(
    model: torch.nn.Module,
    budget_bytes: int,
    *,
    kv_cache_bytes: int = 0,
    activation_bytes: int = 0,
    tiers: tuple[MemoryTier, ...] | None = None,
    offload_dir: str | os.PathLike[str] = ".",
    split_layers: bool = True,
) -> Placement:
    """The placement :func:`stream_weights` would carry out; changes nothing. ``split_layers``:
    see :func:`weight_groups`."""
    return place(
        _specs(model, split_layers),
        budget_bytes=budget_bytes,
        tiers=tiers or default_tiers(offload_dir),
        kv_cache_bytes=kv_cache_bytes,
        activation_bytes=activation_bytes,
    )


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES


def nan_placeholder(dtype: torch.dtype, shape: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` with one element of storage on ``device``: NaN for floats, so
    that a weight read outside its module's forward poisons the output instead of passing unnoticed.
    (Made on the device, never moved there: ``.to()`` would materialize the expanded shape.)"""
    fill = float("nan") if dtype.is_floating_point or dtype.is_complex else 0
    return torch.full((), fill, dtype=dtype, device=device).expand(shape)
