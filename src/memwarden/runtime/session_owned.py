"""What a GovernedSession made and must undo when it closes: the encoder wrappers, the streamed
weights, its temporary folders, and on a GPU the caching allocator's cap."""

from __future__ import annotations

import shutil
import weakref
from typing import TYPE_CHECKING

from memwarden.errors import MemwardenError
from memwarden.runtime.host_memory import allocation_failed, first_line

if TYPE_CHECKING:
    from memwarden.runtime.cuda_reserve import ReserveCap
    from memwarden.runtime.encoders import EncoderCache
    from memwarden.runtime.offload import WeightStreamer
    from memwarden.runtime.offload_cuda import CudaWeightStreamer


class BudgetError(MemwardenError, ValueError):
    """The budget cannot hold the model at all (weights plus the smallest KV pool)."""


class Owned:
    """What a session made and must undo: encoder wrappers, streamed weights, its temporary folders.
    Held apart from the session so that a finalizer can release it when the session is collected
    without ``close()`` (the finalizer must not keep the session alive)."""

    def __init__(self) -> None:
        self.reserve_cap: ReserveCap | None = None  # on a GPU: the caching allocator's cap while serving
        self.encoder_cache: EncoderCache | None = None
        self.streamer: WeightStreamer | CudaWeightStreamer | None = None
        self.folders: list[str] = []
        self.folder_finalizers: dict[str, weakref.finalize] = {}

    def release(self) -> None:
        if self.reserve_cap is not None:  # first: the streamed weights come back past the session's budget
            self.reserve_cap.release()
        if self.encoder_cache is not None:
            self.encoder_cache.remove()
            self.encoder_cache = None
        if self.streamer is not None:
            try:
                self.streamer.detach()
            except (RuntimeError, MemoryError) as exc:
                if not allocation_failed(exc):
                    raise
                # Under a real limit below the weights they cannot all come back: the model keeps
                # streaming them, and their files stay (for as long as the process runs).
                streamer, self.streamer = self.streamer, None
                for folder in self.folders:  # removed with the streamer now, not with the session
                    finalizer = self.folder_finalizers.pop(folder, None)
                    if finalizer is not None:
                        finalizer.detach()
                    weakref.finalize(streamer, shutil.rmtree, folder, ignore_errors=True)
                self.folders.clear()
                raise BudgetError(
                    f"the streamed weights cannot be brought back under this process's memory limit "
                    f"({first_line(exc, 120)}); the model keeps streaming them: call "
                    "model._memwarden_streamer.detach() once there is room"
                ) from None
            self.streamer = None
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)
        self.folders.clear()


__all__ = ["BudgetError", "Owned"]
