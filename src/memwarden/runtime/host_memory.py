"""The process's memory as the host sees it: the real limits a session is held to (cgroup,
``RLIMIT_AS``, a GPU's free memory), what an allocator's refusal looks like, and glibc's knobs
for giving freed memory back to the OS."""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

import torch

from memwarden.runtime.cuda_reserve import SEGMENT_ROOM_BYTES

__all__ = [
    "allocation_failed",
    "first_line",
    "fix_mmap_threshold",
    "limit_cap",
    "load_libc",
    "return_freed_memory",
    "runtime_room",
    "state_bytes",
    "trim_soon",
    "wait_for_trims",
    "warm_cuda_runtime",
]


def allocation_failed(exc: BaseException) -> bool:
    """An allocator's refusal (torch raises RuntimeError with this wording, OutOfMemoryError on CUDA)."""
    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(exc, RuntimeError) and ("allocate" in str(exc) or "out of memory" in str(exc))
    )


def first_line(exc: BaseException, width: int = 160) -> str:
    """An error's first line, at most ``width`` characters; its type's name where it has no message."""
    text = str(exc)
    return text.splitlines()[0][:width] if text.strip() else type(exc).__name__


def limit_cap(held_bytes: int, device: torch.device | None = None) -> tuple[int | None, str]:
    """The most the session can hold under this process's real limits (cgroup, ``RLIMIT_AS``; on a GPU
    the device memory): what it holds now plus what the limits still allow; (None, "") where no
    limit is known."""
    from memwarden.govern.limits import read_limits

    if device is not None and device.type == "cuda":
        # cudaMemGetInfo's free memory (other processes' use already excluded) plus what this process's
        # caching allocator holds cached but unused, which it gives back before failing an allocation.
        free, _total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return held_bytes + free + cached, "GPU's free memory (cudaMemGetInfo)"

    limits = read_limits()
    room = limits.available_bytes
    if room is None:
        return None, ""
    what = "address-space limit (RLIMIT_AS)" if limits.address_space_limit_bytes == limits.limit_bytes else "cgroup"
    return held_bytes + room, what


def load_libc() -> Any:
    """The C library through ctypes, or None where there is none to load."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def return_freed_memory() -> None:
    """Ask glibc to give freed heap pages back to the OS, so that resident memory (what a phone's
    memory killer watches) reflects what the session holds. A no-op elsewhere."""
    libc = load_libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


M_MMAP_THRESHOLD = -3  # mallopt parameter (malloc.h)


def fix_mmap_threshold(threshold_bytes: int) -> bool:
    """Fix glibc's mmap threshold: blocks at least this large are mapped and unmapped on their own.

    glibc raises the threshold (up to 32 MiB) each time a large mapped block is freed, after which
    tensors of that size come from the heap and their pages stay resident when freed; a fixed
    threshold disables that adjustment (``MALLOC_MMAP_THRESHOLD_`` does the same from the
    environment). Measured on the demo deployment: ~15 MiB less resident, same latency.
    Process-wide; returns whether it was applied (glibc only)."""
    libc = load_libc()
    return bool(libc is not None and hasattr(libc, "mallopt") and libc.mallopt(M_MMAP_THRESHOLD, threshold_bytes))


def warm_cuda_runtime(device: torch.device, dtype: torch.dtype = torch.float32) -> int:
    """Run this thread's first matmuls on ``device`` now; the bytes that allocated (0 off CUDA, or
    where it was done before).

    PyTorch allocates the cuBLAS and cuBLASLt workspaces through its caching allocator on the first
    matmul of each (handle, stream) and keeps them (32 MiB + 1 MiB on sm90, 8 MiB + 1 MiB elsewhere:
    ``estimate/cuda_runtime.py``). Done before a session counts what the process holds outside it,
    they are measured there instead of appearing inside its first request."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    with torch.no_grad():
        for kind in dict.fromkeys((dtype, torch.float32)):
            x = torch.ones(8, 8, device=device, dtype=kind)
            try:
                torch.nn.functional.linear(x, x)  # cuBLAS
                torch.nn.functional.linear(x, x, x[0])  # cuBLASLt (a biased linear)
            except RuntimeError:  # a dtype this GPU's BLAS does not do: the model cannot use it either
                pass
            del x
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.memory_allocated(device) - before)


class _Trimmer:
    """``malloc_trim`` on a daemon thread, so that a request's end does not wait for it (~1.6 ms on
    the demo's heap, most of a session's per-request overhead): ctypes releases the GIL for the call,
    and glibc's arena locks keep it safe beside the serving thread's allocations. Where no thread can
    be started (a real limit), it trims in the caller's thread."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._done = threading.Condition()
        self._thread: threading.Thread | None = None
        self.requested = self.trims = 0

    def request(self) -> None:
        with self._done:
            self.requested += 1
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="memwarden-trim", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # can't start new thread
                    self._trim(self.requested)
                    return
                self._thread = thread
        self._wake.set()

    def wait(self, timeout_s: float) -> bool:
        """Until every trim asked for so far has run (or ``timeout_s``); whether they have."""
        with self._done:
            return self._done.wait_for(lambda: self.trims >= self.requested, timeout_s)

    def _trim(self, upto: int) -> None:
        return_freed_memory()
        with self._done:
            self.trims = max(self.trims, upto)
            self._done.notify_all()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._done:
                upto = self.requested
            self._trim(upto)

    def _forked(self) -> None:  # the thread does not exist in a forked child
        self._wake, self._done, self._thread = threading.Event(), threading.Condition(), None
        self.requested = self.trims


_TRIMMER = _Trimmer()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_TRIMMER._forked)


def trim_soon() -> None:
    """Give the heap's freed pages back to the OS shortly, off the caller's path (see ``_Trimmer``)."""
    _TRIMMER.request()


def wait_for_trims(timeout_s: float = 1.0) -> bool:
    """Wait until the trims ``trim_soon`` asked for have run: before reading the resident set."""
    return _TRIMMER.wait(timeout_s)


def state_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers in memory (shared storages once, meta excluded)."""
    seen: set[int] = set()
    total = 0
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.device.type == "meta":
            continue
        st = t.untyped_storage()
        if st.data_ptr() in seen:
            continue
        seen.add(st.data_ptr())
        total += st.nbytes()
    return total


def runtime_room(device: torch.device, dtype: torch.dtype) -> tuple[int, int]:
    """(bytes warmed, bytes of room) a session keeps out of its figures for the runtime itself: on a
    GPU the cuBLAS workspaces are allocated now, outside the session (``warm_cuda_runtime``), and
    room for one new segment of each pool under the allocator's cap is kept; on the host, none."""
    if device.type != "cuda":
        return 0, 0
    return warm_cuda_runtime(device, dtype), SEGMENT_ROOM_BYTES
