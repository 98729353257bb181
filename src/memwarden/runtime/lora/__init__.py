"""LoRA adapters updated in place on a resident model: ``slot`` (hot-swap by per-tensor deltas,
all or nothing, with rollback), ``versions`` (an LRU of adapter versions within a byte budget)
and ``tensors`` (bytes <-> torch, and a PEFT model's adapter parameters by saved name).

The file formats (manifests, deltas) are torch-free and live in ``edge/sync``.
"""
