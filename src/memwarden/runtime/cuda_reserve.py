"""What a session costs a GPU is what PyTorch's caching allocator *reserves*, not what its tensors hold.

Freed blocks stay cached in their segments, and a request that finds no cached block of its size
takes a new segment (2 MiB for small requests, 20 MiB for 1-10 MiB ones, the rounded size above):
``memory_reserved()`` runs ahead of ``memory_allocated()``. Measured on an H200 (docs/gpu-check.md),
a session with streamed weights kept its tensors 2-9 % under its budget while the reserve ran
14-15 % over it.

PyTorch has the cap for this: ``torch.cuda.set_per_process_memory_fraction(f)`` sets the caching
allocator's ``allowed_memory_maximum``. A new segment that would pass it is not taken at once: the
allocator first frees cached blocks (``release_available_cached_blocks``, then
``release_cached_blocks``) and tries again, and raises ``OutOfMemoryError`` only when the live
blocks leave no room (``plan/allocator/model.py`` does the same; the session treats that error as
any real limit's refusal, ``SessionMemory.limit_hit``). The session sets the cap before each request
to what the process holds outside the session plus the budget, and puts back the fraction it found
when it closes. The fraction is process-wide: while the session is open, other allocations on the
device share what the cap leaves them (``SessionConfig.cuda_reserve_cap=False`` turns it off).
"""

from __future__ import annotations

import torch

from memwarden.plan.allocator.config import K_LARGE_BUFFER, K_SMALL_BUFFER

__all__ = ["SEGMENT_ROOM_BYTES", "ReserveCap", "reserve_fraction"]

# Under the cap, a request that finds no cached block needs a whole new segment: one 20 MiB large-pool
# segment and one 2 MiB small-pool segment of room are kept out of what the session plans with.
SEGMENT_ROOM_BYTES = K_LARGE_BUFFER + K_SMALL_BUFFER


def reserve_fraction(*, allocated: int, held: int, budget: int, total: int, prior: float = 1.0) -> float:
    """The memory fraction that holds the process's reserve on a device of ``total`` bytes to what it
    has allocated outside the session (``allocated`` less the session's ``held`` bytes) plus
    ``budget``; never above ``prior`` (a cap already in force is kept) nor 1."""
    if total <= 0:
        raise ValueError(f"a device of {total} bytes has no memory to cap")
    others = max(0, allocated - held)
    return min(1.0, float(prior), (others + max(0, budget)) / total)


class ReserveCap:
    """The caching allocator's cap on one CUDA device, set for a session and put back after it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.total_bytes = int(torch.cuda.get_device_properties(device).total_memory)
        get = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # torch >= 2.8
        self.prior = float(get(device)) if get is not None else 1.0
        self.fraction = self.prior
        self.released = False

    @property
    def limit_bytes(self) -> int:
        """The most the process may reserve on the device now (what the allocator computes)."""
        return int(self.fraction * self.total_bytes)

    def apply(self, budget: int, held: int) -> int:
        """Cap the reserve at the process's allocations outside the session plus ``budget``; the limit."""
        if self.released:
            return self.limit_bytes
        fraction = reserve_fraction(allocated=torch.cuda.memory_allocated(self.device), held=held, budget=budget,
                                    total=self.total_bytes, prior=self.prior)  # fmt: skip
        if fraction != self.fraction:
            torch.cuda.set_per_process_memory_fraction(fraction, self.device)
            self.fraction = fraction
        return self.limit_bytes

    def release(self) -> None:
        """Put back the fraction the session found. Idempotent."""
        if not self.released:
            self.released = True
            if self.fraction != self.prior:
                torch.cuda.set_per_process_memory_fraction(self.prior, self.device)
                self.fraction = self.prior
