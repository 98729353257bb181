"""Live capture of a PyTorch run on CUDA into one Trace with CPU and GPU rows.

Allocation truth on the GPU is PyTorch's own memory history
(``torch.cuda.memory._record_memory_history``): every block the caching allocator hands out or
takes back, and every segment it reserves or releases, so reserved vs allocated is in the trace.
Attribution comes from the live CPU ``Capture`` running at the same time (its module hooks and
spans); ``memwarden.record.cuda.merge`` joins the two on one clock. This class only holds the
two recorders and the clock anchors; it never reaches into the CPU capture's internals.

Usage::

    with capture_cuda() as cap:
        model.to("cuda")
        model.generate(**inputs)
    memwarden.summary(cap.trace, device=cap.trace.device_index("cuda:0"))
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

import torch

from memwarden.interop.snapshot_import import snapshot_to_trace
from memwarden.record.cuda.merge import BlockTag, ClockAnchor, anchor_from_marker, merge_cuda
from memwarden.record.live.capture import Capture
from memwarden.record.modality import ModalityRules
from memwarden.trace.model import Category, Trace

__all__ = ["CudaCapture", "capture_cuda"]

# Sizes of the CPU allocations that anchor the two clocks: odd, so no tensor of a model has them
# by chance, and small, so they cost nothing. They are dropped from the merged trace.
MARKER_START_BYTES = 77_771
MARKER_END_BYTES = 77_773
DEFAULT_MAX_ENTRIES = 1_000_000  # ring buffer of the memory history: ~100 B per entry without stacks


class CudaCapture:
    """Context manager recording the CUDA allocator's history and the CPU capture's spans."""

    def __init__(
        self,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        stacks: bool = False,
        record_ops: bool = True,
        fingerprints: bool = True,
        modality_rules: ModalityRules | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.max_entries = max_entries
        self.stacks = stacks  # Python frames per block: op names guessed from them, at a large cost in size
        self.rules = modality_rules or ModalityRules()
        self.cpu = Capture(
            record_ops=record_ops, fingerprints=fingerprints, modality_rules=self.rules, metadata=metadata
        )
        self.trace: Trace | None = None
        self.cpu_trace: Trace | None = None
        self.snapshot: dict[str, Any] | None = None  # the memory history, as torch.cuda.memory._snapshot() gave it
        self.anchors: list[ClockAnchor] = []
        self.tags: list[BlockTag] = []
        self._marks: list[tuple[int, int, int]] = []  # (marker bytes, wall ns before, wall ns after)
        self._active = False

    def __enter__(self) -> CudaCapture:
        if self._active:
            raise RuntimeError("this capture is already running")
        if not torch.cuda.is_available():
            raise RuntimeError("CudaCapture needs a CUDA device; use memwarden.capture() on CPU")
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc" if self.stacks else None, stacks="python", max_entries=self.max_entries
        )
        self.cpu.__enter__()
        self._active = True
        self._mark(MARKER_START_BYTES)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop()

    def _mark(self, marker_bytes: int) -> None:
        before = time.time_ns()  # CLOCK_REALTIME: the clock the memory history stamps time_us with
        marker = torch.empty(marker_bytes, dtype=torch.uint8)
        after = time.time_ns()
        del marker
        self._marks.append((marker_bytes, before, after))

    def stop(self) -> Trace:
        if not self._active:
            if self.trace is None:
                raise RuntimeError("capture was never started")
            return self.trace
        self._active = False
        try:
            self._mark(MARKER_END_BYTES)
            torch.cuda.synchronize()  # frees waiting on streams complete before the history is read
            self.tags = _parameter_tags(self.rules)
            self.snapshot = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
            self.cpu_trace = self.cpu.stop()
        anchors = [anchor_from_marker(self.cpu_trace, n, before, after) for n, before, after in self._marks]
        self.anchors = [a for a in anchors if a is not None]
        if not self.anchors:
            raise RuntimeError("the CPU recorder logged no clock marker; cannot align the CUDA history")
        # A snapshot this process just made, not a file: the shared-list bomb check has nothing to guard.
        cuda_trace = snapshot_to_trace(self.snapshot, sys.maxsize)
        self.trace = merge_cuda(
            self.cpu_trace, cuda_trace, self.anchors, self.tags, drop_cpu_bytes=(MARKER_START_BYTES, MARKER_END_BYTES)
        )
        return self.trace


def capture_cuda(**kwargs: Any) -> CudaCapture:
    """``with capture_cuda() as cap: ...`` then ``cap.trace``; keywords as ``CudaCapture``'s."""
    return CudaCapture(**kwargs)


def _parameter_tags(rules: ModalityRules) -> list[BlockTag]:
    """Parameters and buffers of every live module tree that sit on a CUDA device, by block address."""
    modules = [o for o in gc.get_objects() if isinstance(o, torch.nn.Module)]
    children = {id(c) for m in modules for c in m.children()}
    tags: dict[tuple[str, int], BlockTag] = {}
    for root in (m for m in modules if id(m) not in children):
        named: list[tuple[str, torch.Tensor, Category]] = [(n, p, Category.WEIGHT) for n, p in root.named_parameters()]
        named += [(n, b, Category.BUFFER) for n, b in root.named_buffers()]
        for name, tensor, category in named:
            if tensor is None or tensor.device.type != "cuda":
                continue
            path = name.rsplit(".", 1)[0] if "." in name else ""
            device = f"cuda:{tensor.device.index}"
            key = (device, tensor.untyped_storage().data_ptr())
            tags.setdefault(
                key,
                BlockTag(
                    device=device, address=key[1], category=category, module=path, modality=rules.modality_of(path)
                ),
            )
    return list(tags.values())
