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
to what the process holds outside the session plus the budget; the fraction the user had comes back
when the last session on the device closes. The fraction is process-wide: while the session is open,
other allocations on the device share what the cap leaves them
(``SessionConfig.cuda_reserve_cap=False`` turns it off), and two sessions on one device take turns:
each sets the cap for its own requests.
"""

from __future__ import annotations

import threading

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


# Per device index: the fraction found before the first open session capped it, and how many are open.
# Two sessions on one device take turns (each sets the cap before its own requests); the fraction the
# user had comes back when the last one closes, and neither reads the other's cap as the user's.
_FOUND: dict[int, list[float]] = {}
_LOCK = threading.Lock()


class ReserveCap:
    """The caching allocator's cap on one CUDA device, set for a session and put back after it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self.total_bytes = int(torch.cuda.get_device_properties(device).total_memory)
        with _LOCK:
            if self.index not in _FOUND:
                get = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # torch >= 2.8
                _FOUND[self.index] = [float(get(self.index)) if get is not None else 1.0, 0]
            _FOUND[self.index][1] += 1
            self.prior = _FOUND[self.index][0]
        self.fraction = self.prior
        self.released = False

    @property
    def limit_bytes(self) -> int:
        """The most the process may reserve on the device under this cap (what the allocator computes)."""
        return int(self.fraction * self.total_bytes)

    def apply(self, budget: int, held: int) -> int:
        """Cap the reserve at the process's allocations outside the session plus ``budget``; the limit."""
        if self.released:
            return self.limit_bytes
        fraction = reserve_fraction(
            allocated=torch.cuda.memory_allocated(self.device),
            held=held,
            budget=budget,
            total=self.total_bytes,
            prior=self.prior,
        )
        torch.cuda.set_per_process_memory_fraction(fraction, self.index)  # another session may have set its own
        self.fraction = fraction
        return self.limit_bytes

    def release(self) -> None:
        """Put back the fraction found before the first open cap on the device, when this is the last
        one open. Idempotent."""
        if self.released:
            return
        self.released = True
        with _LOCK:
            found = _FOUND[self.index]
            found[1] -= 1
            if found[1] == 0:
                del _FOUND[self.index]
                torch.cuda.set_per_process_memory_fraction(found[0], self.index)
