"""What a session does to the model before it serves: the model made ready, its KV layout read, and
whether a cached prefix can be reused whole (M-RoPE families need their positions carried on).

On CPU glibc's mmap threshold is fixed so freed tensors leave the resident set; with
``SessionConfig.quantize`` the linears become int4 weight-only ones in place (``runtime/quant.py``)
and the float weights they replace are handed back to the OS; the KV spec (layers, heads, dtype,
block size) comes from the model's config and its weights' dtype.
"""

from __future__ import annotations

import torch

from memwarden.runtime import media as media_mod
from memwarden.runtime.host_memory import fix_mmap_threshold, return_freed_memory
from memwarden.runtime.kvcache import KVSpec
from memwarden.runtime.mrope import MRopePositions, reuse_limit_reason
from memwarden.runtime.session_config import SessionConfig

__all__ = ["prefix_reuse", "prepare_model"]


def prepare_model(model: torch.nn.Module, config: SessionConfig) -> tuple[torch.device, KVSpec]:
    """The device the model computes on and its KV spec, after the changes ``config`` asks for."""
    on_cpu = all(p.device.type in ("cpu", "meta") for p in model.parameters())
    if config.heap_mmap_threshold is not None and on_cpu:
        fix_mmap_threshold(config.heap_mmap_threshold)  # freed tensors leave the resident set
    if config.quantize is not None:  # int4 weight-only linears, in place (runtime/quant.py)
        from memwarden.runtime.quant import quantize as quantize_model

        quantize_model(model, bits=config.quantize, group_size=config.group_size)
        return_freed_memory()  # the fp32 weights just freed stay in glibc's heap otherwise (RSS)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    device = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
    return device, KVSpec.from_config(model.config, dtype=dtype, block_size=config.block_size)


def prefix_reuse(model: torch.nn.Module, config: SessionConfig) -> tuple[str | None, MRopePositions | None]:
    """Why a cached prefix cannot be reused whole for this family (None: it can), and, for Qwen2-VL /
    Qwen2.5-VL, the M-RoPE positions the session passes for what follows a cached prefix."""
    reason = reuse_limit_reason(model.config, config.prefix_reuse)
    continued = config.prefix_reuse and media_mod.positions_continued(model.config)
    return reason, MRopePositions(model) if continued else None
