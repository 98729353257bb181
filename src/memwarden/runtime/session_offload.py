"""The folder and the streamer a session opens when its weights do not fit its budget.

Weights that do not fit stay in safetensors files, memory-mapped, and stream through two staging
slots (``runtime/offload.py``; on a GPU, pinned host buffers and device slots, no files). The folder
is the session's own unless ``offload_dir`` names one: removed with the session, and at interpreter
exit even if the session is never closed nor collected.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from typing import TYPE_CHECKING

import torch

from memwarden.runtime.session_owned import BudgetError, Owned
from memwarden.units import format_bytes

if TYPE_CHECKING:
    from memwarden.runtime.offload import WeightStreamer
    from memwarden.runtime.offload_cuda import CudaWeightStreamer

__all__ = ["open_streamer"]


def open_streamer(
    model: torch.nn.Module,
    owned: Owned,
    budget: int,
    planned: int,
    device: torch.device,
    offload_dir: str | None,
    *,
    kv_bytes: int,
    reserve: int,
    weights_bytes: int,
) -> tuple[WeightStreamer | CudaWeightStreamer, str]:
    """A streamer for ``model`` planned to ``planned`` bytes beside ``kv_bytes`` of KV and ``reserve``
    of activations, and the folder its files are in (registered with ``owned`` when it is the
    session's own). BudgetError when even streamed the weights do not fit ``budget``."""
    from memwarden.plan.placement import PlacementError
    from memwarden.runtime.offload import stream_weights

    directory = offload_dir
    made = directory is None  # a folder of the session's own: removed with it
    if directory is None:
        directory = tempfile.mkdtemp(prefix="memwarden-offload-")
        owned.folder_finalizers[directory] = weakref.finalize(owned, shutil.rmtree, directory, ignore_errors=True)
    try:
        if planned <= 0:
            raise PlacementError(f"{format_bytes(budget)} is less than the safety margin", min_budget_bytes=budget * 2)
        if device.type == "cuda":
            from memwarden.runtime.offload_cuda import stream_weights_cuda

            streamer: WeightStreamer | CudaWeightStreamer = stream_weights_cuda(
                model, planned, kv_cache_bytes=kv_bytes, activation_bytes=reserve
            )
        else:
            streamer = stream_weights(model, planned, directory, kv_cache_bytes=kv_bytes, activation_bytes=reserve)
    except BaseException as exc:
        if made:
            shutil.rmtree(directory, ignore_errors=True)
        if not isinstance(exc, PlacementError):
            raise
        raise BudgetError(
            f"a budget of {format_bytes(budget)} does not hold the weights ({format_bytes(weights_bytes)}) "
            f"even streamed ({exc}): raise the budget or quantize the weights (memwarden.quantize)"
        ) from None
    if made:
        owned.folders.append(directory)
    return streamer, directory
