"""CUDA allocator rows and CPU hook spans of one run, merged into one Trace (pure numpy).

A CUDA capture has two recorders running at once: PyTorch's memory history (the allocation
truth of the GPU: every block and every segment, stamped with the wall clock in µs) and the
live CPU ``Capture`` (CPU allocations plus the module, step and phase spans of its hooks, on
its own clock relative to its start). ``merge_cuda`` puts the CUDA rows on the CPU trace's
clock and gives each CUDA block the module, modality and phase of the innermost span open
when the allocator handed it out. Blocks are allocated on the host thread at op dispatch, so
the time the allocator stamps is the time the span was open, whatever the GPU is doing.

The clock relation comes from anchors (``ClockAnchor``): a CPU allocation of a marker size
whose trace time the CPU recorder logs, bracketed by wall-clock reads. Nothing here reads a
private field of the CPU capture; the anchors use only what it records.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from memwarden.interop.cuda_blocks import allocated_block_bytes
from memwarden.trace.model import EVENT_COLUMNS, Action, Category, Modality, Phase, SpanKind, Trace

__all__ = [
    "BlockTag",
    "ClockAnchor",
    "anchor_from_marker",
    "merge_cuda",
    "peak_reserved_bytes",
    "reserved_bytes",
    "wall_offset_us",
]

_STARTS = (Action.ALLOC, Action.PREEXISTING, Action.MAP)
_ENDS = (Action.FREE, Action.UNMAP)


@dataclass(frozen=True, kw_only=True)
class ClockAnchor:
    """One instant seen on both clocks: ``wall_us`` (Unix µs, the memory history's clock) and
    ``trace_us`` (the CPU trace's time column). ``error_us`` bounds how far apart they may be."""

    wall_us: int
    trace_us: int
    error_us: int

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClockAnchor:
        return cls(wall_us=int(d["wall_us"]), trace_us=int(d["trace_us"]), error_us=int(d["error_us"]))


@dataclass(frozen=True, kw_only=True)
class BlockTag:
    """What a scan of the live modules found at a CUDA block's address: a parameter or buffer."""

    device: str
    address: int
    category: Category
    module: str
    modality: Modality

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "address": self.address,
            "category": int(self.category),
            "module": self.module,
            "modality": int(self.modality),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BlockTag:
        return cls(
            device=str(d["device"]),
            address=int(d["address"]),
            category=Category(int(d["category"])),
            module=str(d["module"]),
            modality=Modality(int(d["modality"])),
        )


def anchor_from_marker(cpu: Trace, marker_bytes: int, wall_before_ns: int, wall_after_ns: int) -> ClockAnchor | None:
    """The anchor of the last CPU ALLOC of exactly ``marker_bytes`` (made between the two wall reads)."""
    e = cpu.events
    rows = np.flatnonzero((e["action"] == Action.ALLOC) & (e["nbytes"] == marker_bytes))
    if len(rows) == 0:
        return None
    return ClockAnchor(
        wall_us=(wall_before_ns + wall_after_ns) // 2000,
        trace_us=int(e["time_us"][rows[-1]]),
        error_us=max(1, (wall_after_ns - wall_before_ns) // 2000),
    )


def wall_offset_us(anchors: Sequence[ClockAnchor]) -> int:
    """``wall_us - trace_us``, weighted toward the tightest anchors (a run of seconds drifts by
    far less than a µs between two reads of the same system clock)."""
    if not anchors:
        raise ValueError("merging needs at least one clock anchor")
    weights = np.asarray([1.0 / a.error_us for a in anchors])
    offsets = np.asarray([a.wall_us - a.trace_us for a in anchors], dtype=np.float64)
    return int(round(float((weights * offsets).sum() / weights.sum())))


def reserved_bytes(trace: Trace, device: int) -> np.ndarray:
    """Reserved (segment) bytes of ``device`` after each event: what ``memory_reserved()`` read."""
    e = trace.events
    on = e["device"] == device
    signed = np.where(e["action"] == Action.SEGMENT_ALLOC, e["nbytes"], 0)
    signed = np.where(e["action"] == Action.SEGMENT_FREE, -e["nbytes"], signed)
    return np.cumsum(np.where(on, signed, 0).astype(np.int64))


def peak_reserved_bytes(trace: Trace, device: int) -> int:
    return int(reserved_bytes(trace, device).max(initial=0))


def _innermost(times: np.ndarray, starts: np.ndarray, ends: np.ndarray, depths: np.ndarray) -> np.ndarray:
    """For each time (sorted), the index of the deepest span with ``start <= t < end``; -1 if none.
    Spans applied shallow to deep, later ones overwrite: O(spans * log(times))."""
    owner = np.full(len(times), -1, dtype=np.int64)
    for i in np.argsort(depths, kind="stable"):
        lo, hi = np.searchsorted(times, starts[i], "left"), np.searchsorted(times, ends[i], "left")
        owner[lo:hi] = i
    return owner


def _attribute(cpu: Trace, times: np.ndarray) -> dict[str, np.ndarray]:
    """module (index into cpu.strings), modality, phase and category of each CUDA row by time."""
    s = cpu.spans
    n = len(times)
    order = np.argsort(times, kind="stable")
    sorted_t = times[order]
    out: dict[str, np.ndarray] = {
        "module": np.full(n, -1, np.int32),
        "modality": np.full(n, int(Modality.SHARED), np.uint8),
        "phase": np.full(n, int(Phase.OTHER), np.uint8),
        "category": np.full(n, int(Category.OTHER), np.uint8),
    }
    mods = np.flatnonzero(s["kind"] == SpanKind.MODULE)
    owner = _innermost(sorted_t, s["start_us"][mods], s["end_us"][mods], s["depth"][mods])
    has = owner >= 0
    rows = order[has]
    out["module"][rows] = s["name"][mods][owner[has]]
    out["modality"][rows] = s["modality"][mods][owner[has]]
    # Memory made inside a model call and not tagged as a weight later is that call's working set.
    out["category"][rows] = int(Category.ACTIVATION)
    timed = np.flatnonzero((s["kind"] == SpanKind.STEP) | (s["kind"] == SpanKind.PHASE))
    owner = _innermost(sorted_t, s["start_us"][timed], s["end_us"][timed], s["depth"][timed])
    has = owner >= 0
    out["phase"][order[has]] = s["phase"][timed][owner[has]]
    return out


def _remap(values: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Indices into one table -> indices into another (-1 stays -1)."""
    return np.where(values >= 0, table[np.maximum(values, 0)] if len(table) else -1, -1).astype(values.dtype)


def merge_cuda(
    cpu: Trace,
    cuda: Trace,
    anchors: Sequence[ClockAnchor],
    tags: Iterable[BlockTag] = (),
    *,
    drop_cpu_bytes: Iterable[int] = (),
) -> Trace:
    """One trace: ``cpu``'s rows and spans, plus ``cuda``'s rows (from ``snapshot_to_trace``) on
    ``cpu``'s clock, attributed by the spans open when each block was allocated.

    CUDA block rows count the allocator's block (``allocated_block_bytes``), segment rows the
    segment. ``tags`` (parameters and buffers found at the end of the run) override a block's category and
    module: weights moved to the GPU are allocated outside any module call. CPU ALLOC/FREE pairs of
    the sizes in ``drop_cpu_bytes`` (the clock markers) are left out. A FREE row repeats its
    block's attribution, as everywhere in a Trace.
    """
    offset = wall_offset_us(anchors)
    ce = cuda.events
    n = cuda.num_events
    times = np.maximum(ce["time_us"] - offset, 0)
    action = ce["action"]
    attr = _attribute(cpu, times)

    # strings, shapes and devices of the merged trace: cpu's first, so its spans keep their indices
    strings = list(cpu.strings)
    index = {text: i for i, text in enumerate(strings)}

    def intern(text: str) -> int:
        if text not in index:
            index[text] = len(strings)
            strings.append(text)
        return index[text]

    string_map = np.asarray([intern(t) for t in cuda.strings], dtype=np.int64)
    shapes = list(cpu.shapes)
    shape_index = {shape: i for i, shape in enumerate(shapes)}
    for shape in cuda.shapes:
        if shape not in shape_index:
            shape_index[shape] = len(shapes)
            shapes.append(shape)
    shape_map = np.asarray([shape_index[s] for s in cuda.shapes], dtype=np.int64)
    devices = list(cpu.devices)
    for name in cuda.devices:
        if name not in devices:
            devices.append(name)
    device_map = np.asarray([devices.index(name) for name in cuda.devices], dtype=np.int64)

    module = attr["module"]
    category = attr["category"]
    modality = attr["modality"]
    guessed = _remap(ce["module"], string_map)  # from frames, when the history kept stacks
    module = np.where(module >= 0, module, guessed).astype(np.int32)
    dev_names = [cuda.devices[d] for d in ce["device"]] if n else []
    last_start: dict[tuple[str, int], int] = {}
    for row in np.flatnonzero(np.isin(action, np.asarray(_STARTS, np.uint8))).tolist():
        last_start[(dev_names[row], int(ce["address"][row]))] = row
    for tag in tags:
        tagged = last_start.get((tag.device, tag.address))
        if tagged is not None:
            row = tagged
            category[row] = int(tag.category)
            module[row] = intern(tag.module)
            modality[row] = int(tag.modality)
            if attr["phase"][row] == Phase.OTHER:  # weights moved in outside any step (model.to("cuda"))
                attr["phase"][row] = int(Phase.LOAD)

    # FREE rows take their block's attribution (tensor ids pair them within the cuda trace)
    start_of = {int(ce["tensor"][r]): r for r in np.flatnonzero(np.isin(action, np.asarray(_STARTS, np.uint8)))}
    for r in np.flatnonzero(np.isin(action, np.asarray(_ENDS, np.uint8))).tolist():
        s = start_of.get(int(ce["tensor"][r]))
        if s is not None:
            for col in (module, category, modality, attr["phase"]):
                col[r] = col[s]

    cpu_e = cpu.events
    keep = np.ones(cpu.num_events, dtype=bool)
    marker_sizes = np.asarray(list(drop_cpu_bytes), dtype=np.int64)
    if len(marker_sizes):
        marker_ids = cpu_e["tensor"][(cpu_e["action"] == Action.ALLOC) & np.isin(cpu_e["nbytes"], marker_sizes)]
        keep &= ~np.isin(cpu_e["tensor"], marker_ids)
    id_base = int(cpu_e["tensor"].max(initial=0)) + 1
    cuda_cols: dict[str, np.ndarray] = {
        "time_us": times,
        "action": action,
        "tensor": ce["tensor"] + id_base,
        "address": ce["address"],
        # Blocks, as memory_allocated() counts them: the request rounded, or the whole free block
        # when the allocator did not split it. The allocator model, fed a block size, picks the same
        # block and splits nothing (the block is the smallest free one that fits either size).
        "nbytes": allocated_block_bytes(cuda).astype(ce["nbytes"].dtype),
        "device": device_map[ce["device"]] if n else ce["device"],
        "category": category,
        "modality": modality,
        "phase": attr["phase"],
        "module": module,
        "op": _remap(ce["op"], string_map),
        "dtype": _remap(ce["dtype"], string_map),
        "shape": _remap(ce["shape"], shape_map),
        "written_bytes": ce["written_bytes"],
        "line": _remap(ce["line"], string_map),  # user source lines, where the history's frames gave them
        "stack": _remap(ce["stack"], string_map),
    }
    events = {
        name: np.concatenate([cpu_e[name][keep], cuda_cols[name]]).astype(dt) for name, dt in EVENT_COLUMNS.items()
    }
    order = np.argsort(events["time_us"], kind="stable")  # CPU rows first among equal times
    events = {name: column[order] for name, column in events.items()}
    metadata = dict(cpu.metadata)
    metadata["capture"] = "memwarden-cuda"
    cuda_devices = [name for name in cuda.devices if name != "cpu"]
    if cuda_devices:
        metadata["device"] = cuda_devices[0]  # summary() talks about the GPU unless told otherwise
    metadata["cuda"] = {
        "wall_offset_us": offset,
        "anchors": [a.to_json() for a in anchors],
        **{k: v for k, v in cuda.metadata.items() if k != "source"},
    }
    spans = {name: column.copy() for name, column in cpu.spans.items()}
    return Trace(events=events, spans=spans, strings=strings, shapes=shapes, devices=devices, metadata=metadata)
