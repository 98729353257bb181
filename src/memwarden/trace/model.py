"""The Trace: memwarden's one data model.

A Trace is columnar: one numpy array per event field, plus string tables, a
shape table, spans (module calls, phases, steps) and free-form metadata. It
imports nothing of memwarden and nothing of torch, so analyses and planners
can use it on any machine.

Events
    Every event is one row. ``action`` says what happened to a block of
    memory identified by ``tensor`` (a capture-unique id, equal for the alloc
    and the free of one block) at ``address`` with ``nbytes`` bytes.
    Attribution columns (category, modality, phase, module, op, dtype, shape)
    are filled on the ALLOC/MAP row; a FREE/UNMAP row repeats them so that
    each row can be read alone.

Spans
    ``[start_us, end_us)`` intervals: module calls (with a content fingerprint
    of their tensor inputs), phases, steps and user marks.

File format: ``memwarden.trace.format`` (bytes) and ``memwarden.trace.io`` (files); see
docs/trace-format.md.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memwarden.errors import MemwardenError


class TraceFormatError(MemwardenError, ValueError):
    """A file is not a readable .mwtrace (wrong magic, version, truncated, corrupt)."""


class Action(enum.IntEnum):
    ALLOC = 0  # anonymous memory handed out by an allocator
    FREE = 1
    MAP = 2  # file-backed memory (mmap'd checkpoint): counted apart from allocator memory
    UNMAP = 3
    PREEXISTING = 4  # alive before capture started; counts as live from the start
    SEGMENT_ALLOC = 5  # allocator reserved memory from the device (CUDA cudaMalloc)
    SEGMENT_FREE = 6
    OOM = 7


class Category(enum.IntEnum):
    WEIGHT = 0
    BUFFER = 1
    ACTIVATION = 2
    KV_CACHE = 3
    GRADIENT = 4
    OPTIMIZER_STATE = 5
    TEMPORARY = 6
    INPUT = 7
    OTHER = 8


class Modality(enum.IntEnum):
    VISION = 0
    AUDIO = 1
    TEXT = 2
    FUSION = 3
    SHARED = 4


class Phase(enum.IntEnum):
    LOAD = 0
    ENCODE = 1
    PREFILL = 2
    DECODE = 3
    BACKWARD = 4
    OPTIMIZER = 5
    OTHER = 6


class SpanKind(enum.IntEnum):
    MODULE = 0
    PHASE = 1
    STEP = 2
    MARK = 3


def enum_name(member: enum.IntEnum) -> str:
    return member.name.lower()


def parse_enum(cls: type[enum.IntEnum], name: str) -> enum.IntEnum:
    try:
        return cls[name.upper()]
    except KeyError:
        valid = ", ".join(enum_name(m) for m in cls)
        raise ValueError(f"unknown {cls.__name__.lower()} {name!r} (valid: {valid})") from None


# Column name -> numpy dtype. Order is the on-disk order.
EVENT_COLUMNS: dict[str, np.dtype[Any]] = {
    "time_us": np.dtype("<i8"),
    "action": np.dtype("u1"),
    "tensor": np.dtype("<i8"),  # block id: pairs an ALLOC with its FREE
    "address": np.dtype("<u8"),
    "nbytes": np.dtype("<i8"),
    "device": np.dtype("<i2"),  # index into Trace.devices
    "category": np.dtype("u1"),
    "modality": np.dtype("u1"),
    "phase": np.dtype("u1"),
    "module": np.dtype("<i4"),  # index into Trace.strings, -1 = none
    "op": np.dtype("<i4"),  # index into Trace.strings, -1 = none
    "dtype": np.dtype("<i4"),  # index into Trace.strings, -1 = unknown
    "shape": np.dtype("<i4"),  # index into Trace.shapes, -1 = unknown
    "written_bytes": np.dtype("<i8"),  # bytes ops wrote into the block (see docs/trace-format.md), -1 = unknown
    "line": np.dtype("<i4"),  # index into Trace.strings: "file:line:function" of the innermost user frame, -1 = none
    "stack": np.dtype("<i4"),  # index into Trace.strings: the Python stack, one frame a line, -1 = not recorded
}

# Fill value of a column that a producer did not supply.
_EVENT_DEFAULTS = {"module": -1, "op": -1, "dtype": -1, "shape": -1, "written_bytes": -1, "line": -1, "stack": -1}

SPAN_COLUMNS: dict[str, np.dtype[Any]] = {
    "start_us": np.dtype("<i8"),
    "end_us": np.dtype("<i8"),
    "kind": np.dtype("u1"),
    "name": np.dtype("<i4"),  # index into Trace.strings (module path, phase name, ...)
    "phase": np.dtype("u1"),
    "modality": np.dtype("u1"),
    "fingerprint": np.dtype("<i4"),  # index into Trace.strings, -1 = none
    "parent": np.dtype("<i4"),  # row of the enclosing span, -1 = none
    "depth": np.dtype("<i2"),
}


@dataclass
class Trace:
    """Columnar allocation trace. Build with ``TraceBuilder``; read the columns."""

    events: dict[str, np.ndarray]
    spans: dict[str, np.ndarray]
    strings: list[str] = field(default_factory=list)
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(next(iter(self.events.values()))) if self.events else 0
        for name, dt in EVENT_COLUMNS.items():
            if name not in self.events:
                self.events[name] = np.full(n, _EVENT_DEFAULTS.get(name, 0), dtype=dt)
            self.events[name] = np.ascontiguousarray(self.events[name], dtype=dt)
        for name, dt in SPAN_COLUMNS.items():
            self.spans[name] = np.ascontiguousarray(self.spans.get(name, np.zeros(0, dt)), dtype=dt)
        lengths = {len(v) for v in self.events.values()}
        if len(lengths) > 1:
            raise TraceFormatError(f"event columns have different lengths: {sorted(lengths)}")
        lengths = {len(v) for v in self.spans.values()}
        if len(lengths) > 1:
            raise TraceFormatError(f"span columns have different lengths: {sorted(lengths)}")

    # -- sizes ---------------------------------------------------------------
    @property
    def num_events(self) -> int:
        return int(len(self.events["time_us"]))

    @property
    def num_spans(self) -> int:
        return int(len(self.spans["start_us"]))

    def __len__(self) -> int:
        return self.num_events

    def with_events(self, events: dict[str, np.ndarray]) -> Trace:
        """These strings, shapes, devices, spans and metadata with other event columns (rows added
        to or merged into this trace's, their string and shape ids this trace's)."""
        return dataclasses.replace(self, events=events)

    # -- lookups -------------------------------------------------------------
    def string(self, index: int) -> str | None:
        return None if index < 0 else self.strings[index]

    def shape(self, index: int) -> tuple[int, ...] | None:
        return None if index < 0 else self.shapes[index]

    def device_index(self, name: str) -> int:
        return self.devices.index(name)

    # -- derived -------------------------------------------------------------
    def signed_bytes(self, device: int | None = None, include_file_backed: bool = True) -> np.ndarray:
        """Per event: +nbytes for ALLOC/MAP/PREEXISTING, -nbytes for FREE/UNMAP, 0 otherwise."""
        action = self.events["action"]
        nbytes = self.events["nbytes"]
        plus = (action == Action.ALLOC) | (action == Action.PREEXISTING)
        minus = action == Action.FREE
        if include_file_backed:
            plus |= action == Action.MAP
            minus |= action == Action.UNMAP
        signed = np.where(plus, nbytes, np.where(minus, -nbytes, 0))
        if device is not None:
            signed = np.where(self.events["device"] == device, signed, 0)
        return signed.astype(np.int64)

    def live_bytes(self, device: int | None = None, include_file_backed: bool = True) -> np.ndarray:
        """Live tensor bytes after each event (events are in time order)."""
        return np.cumsum(self.signed_bytes(device, include_file_backed))


class TraceBuilder:
    """Appends events and spans row by row, interning strings and shapes."""

    def __init__(self, devices: Iterable[str] = ("cpu",), metadata: dict[str, Any] | None = None):
        self._events: dict[str, list[int]] = {name: [] for name in EVENT_COLUMNS}
        self._spans: dict[str, list[int]] = {name: [] for name in SPAN_COLUMNS}
        self._strings: list[str] = []
        self._string_ids: dict[str, int] = {}
        self._shapes: list[tuple[int, ...]] = []
        self._shape_ids: dict[tuple[int, ...], int] = {}
        self.devices = list(devices)
        self.metadata = dict(metadata or {})

    def intern(self, text: str | None) -> int:
        if text is None:
            return -1
        index = self._string_ids.get(text)
        if index is None:
            index = self._string_ids[text] = len(self._strings)
            self._strings.append(text)
        return index

    def intern_shape(self, shape: tuple[int, ...] | None) -> int:
        if shape is None:
            return -1
        shape = tuple(int(d) for d in shape)
        index = self._shape_ids.get(shape)
        if index is None:
            index = self._shape_ids[shape] = len(self._shapes)
            self._shapes.append(shape)
        return index

    def device(self, name: str) -> int:
        if name not in self.devices:
            self.devices.append(name)
        return self.devices.index(name)

    def event(
        self,
        time_us: int,
        action: Action,
        tensor: int,
        address: int,
        nbytes: int,
        *,
        device: str = "cpu",
        category: Category = Category.OTHER,
        modality: Modality = Modality.SHARED,
        phase: Phase = Phase.OTHER,
        module: str | None = None,
        op: str | None = None,
        dtype: str | None = None,
        shape: tuple[int, ...] | None = None,
        written_bytes: int = -1,
        line: str | None = None,
        stack: str | None = None,
    ) -> int:
        row = len(self._events["time_us"])
        e = self._events
        e["time_us"].append(int(time_us))
        e["action"].append(int(action))
        e["tensor"].append(int(tensor))
        e["address"].append(int(address))
        e["nbytes"].append(int(nbytes))
        e["device"].append(self.device(device))
        e["category"].append(int(category))
        e["modality"].append(int(modality))
        e["phase"].append(int(phase))
        e["module"].append(self.intern(module))
        e["op"].append(self.intern(op))
        e["dtype"].append(self.intern(dtype))
        e["shape"].append(self.intern_shape(shape))
        e["written_bytes"].append(int(written_bytes))
        e["line"].append(self.intern(line))
        e["stack"].append(self.intern(stack))
        return row

    def span(
        self,
        start_us: int,
        end_us: int,
        kind: SpanKind,
        name: str,
        *,
        phase: Phase = Phase.OTHER,
        modality: Modality = Modality.SHARED,
        fingerprint: str | None = None,
        parent: int = -1,
        depth: int = 0,
    ) -> int:
        row = len(self._spans["start_us"])
        s = self._spans
        s["start_us"].append(int(start_us))
        s["end_us"].append(int(end_us))
        s["kind"].append(int(kind))
        s["name"].append(self.intern(name))
        s["phase"].append(int(phase))
        s["modality"].append(int(modality))
        s["fingerprint"].append(self.intern(fingerprint))
        s["parent"].append(int(parent))
        s["depth"].append(int(depth))
        return row

    def extend_spans(self, columns: dict[str, Any]) -> None:
        """Append many spans at once; ``columns`` holds already-interned indices."""
        for name in SPAN_COLUMNS:
            self._spans[name].extend(np.asarray(columns[name]).astype(np.int64).tolist())

    def build(self) -> Trace:
        events = {k: np.asarray(v, dtype=EVENT_COLUMNS[k]) for k, v in self._events.items()}
        spans = {k: np.asarray(v, dtype=SPAN_COLUMNS[k]) for k, v in self._spans.items()}
        order = np.argsort(events["time_us"], kind="stable")
        if len(order) and np.any(order != np.arange(len(order))):
            events = {k: v[order] for k, v in events.items()}
        return Trace(
            events=events,
            spans=spans,
            strings=list(self._strings),
            shapes=list(self._shapes),
            devices=list(self.devices),
            metadata=dict(self.metadata),
        )
