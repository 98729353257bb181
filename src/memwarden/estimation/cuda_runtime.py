"""What a CUDA device loses beyond the model's tensors: the estimate's runtime lines.

A request whose tensors peak at P bytes takes more than P from a GPU:

- **cuBLAS and cuBLASLt workspaces.** PyTorch allocates them through its caching allocator on the
  first matmul of each (handle, stream) and keeps them, so they are in ``memory_allocated()``:
  ``CUBLAS_WORKSPACE_CONFIG``'s default is ``:4096:8`` (32 MiB) on sm90/sm100 and
  ``:4096:2:16:8`` (8 MiB + 128 KiB) elsewhere (aten/src/ATen/cuda/CublasHandlePool.cpp,
  ``parseChosenWorkspaceSize``); cuBLASLt's ``TORCH_CUBLASLT_WORKSPACE_SIZE`` defaults to 1 MiB.
  Measured on an H200 with torch 2.11/CUDA 13.0: 32 MiB on the first linear, 1 MiB more on the
  first biased one (``scripts/gpu-check.sh``'s probe).
- **The caching allocator's reserve.** Blocks are carved from 2 MiB / 20 MiB / rounded segments
  and freed blocks stay cached: ``memory_reserved()`` runs ahead of ``memory_allocated()``. The
  estimate's own allocation sequence, workspaces included, is replayed through the allocator model
  (``memwarden.plan.allocator``), which reproduces a real run's reserved bytes exactly
  (tests/test_cuda_allocator.py, the gpu-check table).
- **The CUDA context** (driver state, loaded kernels): outside PyTorch's allocator, counted by
  nvidia-smi. 685 MiB measured on the H200 (CUDA 13.0, lazy module loading, after the first
  cuBLAS call); shown as a line and counted in the device profile's reserved share.

The verdict on a CUDA device compares the *reserved* peak with what the device leaves.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memwarden.analyze.timeline import primary_device
from memwarden.plan.replay import replay
from memwarden.trace.model import EVENT_COLUMNS, Action, Category, Phase, Trace

__all__ = ["CUBLASLT_WORKSPACE_BYTES", "MEASURED_CONTEXT_BYTES", "cublas_workspace_bytes", "cuda_runtime", "is_cuda"]

MiB = 1 << 20
CUBLASLT_WORKSPACE_BYTES = 1 * MiB
MEASURED_CONTEXT_BYTES = 685 * MiB  # H200, CUDA 13.0, torch 2.11 (gpu-check probe: nvidia-smi less reserved)
# Compute capability of the built-in CUDA profiles (NVIDIA's CUDA GPUs list, developer.nvidia.com/cuda-gpus).
CAPABILITY = {
    "h200": (9, 0),
    "h100": (9, 0),
    "a100": (8, 0),
    "l4": (8, 9),
    "rtx-4090": (8, 9),
    "rtx-4060": (8, 9),
    "t4": (7, 5),
    "jetson-agx-orin": (8, 7),
    "jetson-orin": (8, 7),
}


def is_cuda(device: Any) -> bool:
    """Whether a device profile computes with CUDA (its accelerators name it)."""
    compute = getattr(device, "compute", None)
    return "cuda" in tuple(getattr(compute, "accelerators", ()) or ())


def capability_of(device: Any) -> tuple[int, int] | None:
    ident = str(getattr(device, "id", ""))
    return next((cap for prefix, cap in CAPABILITY.items() if ident.startswith(prefix)), None)


def cublas_workspace_bytes(capability: tuple[int, int] | None) -> int:
    """PyTorch's default cuBLAS workspace for a compute capability (``parseChosenWorkspaceSize``)."""
    if capability in ((9, 0), (10, 0)):
        return 4096 * 8 * 1024
    return 4096 * 1024 * 2 + 16 * 1024 * 8


def _with_workspaces(trace: Trace, device: int, workspaces: list[int]) -> Trace:
    """``trace`` with the workspaces allocated (never freed) where the first step starts: the first
    matmul of a request runs in its first step, after the weights are in place."""
    e = trace.events
    on = np.flatnonzero((e["device"] == device) & (e["phase"] != Phase.LOAD) & (e["action"] == Action.ALLOC))
    at = int(on[0]) if len(on) else trace.num_events
    t = int(e["time_us"][at]) if at < trace.num_events else int(e["time_us"].max(initial=0))
    first_id = int(e["tensor"].max(initial=0)) + 1
    rows = {name: np.zeros(len(workspaces), dtype=dt) for name, dt in EVENT_COLUMNS.items()}
    rows["time_us"][:] = t
    rows["action"][:] = Action.ALLOC
    rows["tensor"][:] = np.arange(first_id, first_id + len(workspaces))
    rows["nbytes"][:] = workspaces
    rows["device"][:] = device
    rows["category"][:] = Category.OTHER
    for col in ("module", "op", "dtype", "shape", "line", "stack"):
        rows[col][:] = -1
    events = {name: np.concatenate([e[name][:at], rows[name], e[name][at:]]) for name in EVENT_COLUMNS}
    return trace.with_events(events)


def cuda_runtime(trace: Trace, device: Any, peak_bytes: int) -> dict[str, Any]:
    """The runtime lines of a card on CUDA ``device`` (a profile), from the meta ``trace`` of the
    request; ``peak_bytes`` is the card's tensor peak (a longer generation's may exceed the trace's)."""
    capability = capability_of(device)
    workspaces = [cublas_workspace_bytes(capability), CUBLASLT_WORKSPACE_BYTES]
    dev = primary_device(trace)
    result = replay(_with_workspaces(trace, dev, workspaces), device=dev)
    reserve = max(0, result.peak_reserved_bytes - result.peak_allocated_bytes)
    allocated = peak_bytes + sum(workspaces)
    return {
        "compute_capability": None if capability is None else f"{capability[0]}.{capability[1]}",
        "cublas_workspace_bytes": workspaces[0],
        "cublaslt_workspace_bytes": workspaces[1],
        "allocator_reserve_bytes": reserve,
        "allocated_peak_bytes": allocated,  # what torch.cuda.max_memory_allocated() would read
        "reserved_peak_bytes": allocated + reserve,  # ... max_memory_reserved(): what the device loses
        "cuda_context_bytes": MEASURED_CONTEXT_BYTES,  # in the profile's reserved share, not added again
    }


def runtime_lines(runtime: dict[str, Any]) -> list[str]:
    from memwarden.units import format_bytes

    return [
        f"CUDA runtime: cuBLAS workspace {format_bytes(runtime['cublas_workspace_bytes'])} + cuBLASLt "
        f"{format_bytes(runtime['cublaslt_workspace_bytes'])}, allocator reserve "
        f"{format_bytes(runtime['allocator_reserve_bytes'])} -> reserved peak {format_bytes(runtime['reserved_peak_bytes'])}",
        f"CUDA context about {format_bytes(runtime['cuda_context_bytes'])} (measured on an H200, CUDA 13.0), "
        "in the device's reserved share",
    ]
