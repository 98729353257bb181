"""ORT's profiling JSON, read into per-run, per-node records.

With ``SessionOptions.enable_profiling`` ORT writes a Chrome-trace JSON: one ``Session`` event
``model_run`` per ``run()`` and one ``Node`` event ``<node>_kernel_time`` per kernel, whose
``args`` hold the output shapes and types (``output_type_shape``), the bytes of outputs,
activations and parameters, and (ORT >= 1.2x with the CPU arena) the allocator's own counters
after the kernel: ``mem_bytes_in_use``, ``mem_in_use_peak``, ``mem_arena_held``. The file is
written by ORT, but it is still parsed defensively: a field that is missing or malformed is
skipped, never trusted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memwarden.errors import InputError

__all__ = ["NodeRun", "RunProfile", "read_profile"]

_KERNEL_SUFFIX = "_kernel_time"


@dataclass(frozen=True, kw_only=True)
class NodeRun:
    """One kernel execution: when, which node, and what it produced."""

    name: str
    op_type: str
    start_us: int
    dur_us: int
    provider: str
    outputs: tuple[tuple[str, tuple[int, ...]], ...]  # (element type, shape) per produced output
    output_bytes: int  # ORT's ``output_size``
    in_use_bytes: int | None  # arena bytes in use after the kernel (chunks, rounded), None without stats
    in_use_peak_bytes: int | None  # the arena's high-water mark so far (rounded chunks)
    requested_bytes: int | None  # bytes requested and not yet released after the kernel (unrounded)
    requested_delta_bytes: int | None


@dataclass
class RunProfile:
    """One ``session.run``: its span and its kernels in execution order."""

    start_us: int
    end_us: int
    nodes: list[NodeRun] = field(default_factory=list)

    def high_water(self) -> int | None:
        """How far the arena's high-water mark (rounded chunks, temporaries included) rose above
        what was in use when the run began; None without allocator counters."""
        first = next((n for n in self.nodes if n.in_use_bytes is not None), None)
        peaks = [n.in_use_peak_bytes for n in self.nodes if n.in_use_peak_bytes is not None]
        if first is None or first.in_use_bytes is None or not peaks or first.requested_delta_bytes is None:
            return None
        in_use_before = first.in_use_bytes - first.requested_delta_bytes  # first kernel's outputs: rounding is small
        return max(peaks) - in_use_before

    def arena_peak(self) -> tuple[int, int] | None:
        """(requested bytes in use when the run began, highest requested bytes in use after any
        kernel), or None where ORT wrote no allocator counters (arena off, older ORT)."""
        first = next((n for n in self.nodes if n.requested_bytes is not None), None)
        if first is None or first.requested_delta_bytes is None or first.requested_bytes is None:
            return None
        before = first.requested_bytes - first.requested_delta_bytes
        peak = max(n.requested_bytes for n in self.nodes if n.requested_bytes is not None)
        return before, peak


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _outputs(raw: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    out = []
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, dict) and len(item) == 1:
            ((dtype, shape),) = item.items()
            if isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape):
                out.append((str(dtype).lower(), tuple(shape)))
    return tuple(out)


def read_profile(path: str | Path) -> list[RunProfile]:
    """The runs of an ORT profile file, each with its kernels sorted by start time."""
    try:
        events = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the ONNX Runtime profile {path}: {exc}") from None
    if not isinstance(events, list):
        raise InputError(f"{path}: not an ONNX Runtime profile")
    runs = [
        RunProfile(start_us=int(e["ts"]), end_us=int(e["ts"]) + int(e.get("dur", 0)))
        for e in events
        if isinstance(e, dict)
        and e.get("cat") == "Session"
        and e.get("name") == "model_run"
        and _int(e.get("ts")) is not None
    ]
    runs.sort(key=lambda r: r.start_us)
    for e in events:
        if not (isinstance(e, dict) and e.get("cat") == "Node" and str(e.get("name", "")).endswith(_KERNEL_SUFFIX)):
            continue
        raw_args = e.get("args")
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        start = _int(e.get("ts"))
        if start is None:
            continue
        node = NodeRun(
            name=str(e["name"])[: -len(_KERNEL_SUFFIX)],
            op_type=str(args.get("op_name", "")),
            start_us=start,
            dur_us=max(0, _int(e.get("dur")) or 0),
            provider=str(args.get("provider", "")),
            outputs=_outputs(args.get("output_type_shape")),
            output_bytes=_int(args.get("output_size")) or 0,
            in_use_bytes=_int(args.get("mem_bytes_in_use")),
            in_use_peak_bytes=_int(args.get("mem_in_use_peak")),
            requested_bytes=_int(args.get("mem_bytes_requested_in_use")),
            requested_delta_bytes=_int(args.get("mem_requested_in_use_delta")),
        )
        for run in runs:
            if run.start_us <= start <= run.end_us:
                run.nodes.append(node)
                break
    for run in runs:
        run.nodes.sort(key=lambda n: n.start_us)
    return runs
