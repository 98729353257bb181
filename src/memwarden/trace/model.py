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

File format: see docs/trace-format.md (``save`` / ``load``).
"""

from __future__ import annotations

import enum
import json
import os
import struct
import tempfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_MAGIC = b"MWTRACE\0"
FORMAT_VERSION = 1
_ALIGN = 64  # column payloads start on 64-byte boundaries so np.frombuffer is zero-copy
_HEADER_LIMIT_BYTES = 256 * 1024 * 1024  # refuse absurd headers before parsing them


class TraceFormatError(ValueError):
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
}

# Fill value of a column that a producer did not supply.
_EVENT_DEFAULTS = {"module": -1, "op": -1, "dtype": -1, "shape": -1, "written_bytes": -1}

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


# -- file format ------------------------------------------------------------------


def _padding(offset: int) -> int:
    return (-offset) % _ALIGN


def dumps(trace: Trace) -> bytes:
    """Serialise to the .mwtrace byte layout (see docs/trace-format.md)."""
    columns: list[tuple[str, np.ndarray]] = [("events." + k, trace.events[k]) for k in EVENT_COLUMNS]
    columns += [("spans." + k, trace.spans[k]) for k in SPAN_COLUMNS]
    descriptors: list[dict[str, Any]] = []
    offset = 0
    for name, array in columns:
        offset += _padding(offset)
        descriptors.append({"name": name, "dtype": array.dtype.str, "length": int(len(array)), "offset": offset})
        offset += array.nbytes
    payload = bytearray(offset)
    for desc, (_, array) in zip(descriptors, columns, strict=False):
        start = int(desc["offset"])
        payload[start : start + array.nbytes] = array.tobytes()
    header = {
        "version": FORMAT_VERSION,
        "num_events": trace.num_events,
        "num_spans": trace.num_spans,
        "columns": descriptors,
        "strings": trace.strings,
        "shapes": [list(s) for s in trace.shapes],
        "devices": trace.devices,
        "metadata": trace.metadata,
        "payload_bytes": len(payload),
        "payload_crc32": zlib.crc32(payload),
    }
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    prefix = FORMAT_MAGIC + struct.pack("<IQ", FORMAT_VERSION, len(header_bytes))
    head = prefix + header_bytes
    head += b"\0" * _padding(len(head))
    return bytes(head) + bytes(payload)


def loads(data: bytes | memoryview) -> Trace:
    """Parse .mwtrace bytes; raises TraceFormatError with a clear reason."""
    view = memoryview(data)
    fixed = len(FORMAT_MAGIC) + 12
    if len(view) < fixed or bytes(view[: len(FORMAT_MAGIC)]) != FORMAT_MAGIC:
        raise TraceFormatError("not a memwarden trace (bad magic bytes)")
    version, header_len = struct.unpack("<IQ", view[len(FORMAT_MAGIC) : fixed])
    if version != FORMAT_VERSION:
        raise TraceFormatError(f"unsupported trace format version {version} (this memwarden reads {FORMAT_VERSION})")
    if header_len > _HEADER_LIMIT_BYTES or fixed + header_len > len(view):
        raise TraceFormatError("trace is truncated (header runs past end of file)")
    try:
        header = json.loads(bytes(view[fixed : fixed + header_len]))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError: also a number longer than Python's int-conversion digit limit; RecursionError:
        # arrays nested deeper than the JSON decoder recurses. Both are corrupt headers, not bugs.
        raise TraceFormatError(f"trace header is corrupt ({exc.__class__.__name__})") from None
    if not isinstance(header, dict):
        raise TraceFormatError("trace header is corrupt (not an object)")
    start = fixed + header_len
    start += _padding(start)
    try:
        payload_bytes = int(header["payload_bytes"])
        if start + payload_bytes != len(view):
            raise TraceFormatError(
                f"trace is truncated or has trailing data ({len(view) - start} payload bytes, header says {payload_bytes})"
            )
        payload = view[start:]
        if zlib.crc32(payload) != int(header["payload_crc32"]):
            raise TraceFormatError("trace payload is corrupt (checksum mismatch)")
        arrays: dict[str, np.ndarray] = {}
        for desc in header["columns"]:
            dt = np.dtype(desc["dtype"])
            name, offset, length = str(desc["name"]), int(desc["offset"]), int(desc["length"])
            expected = EVENT_COLUMNS.get(name[7:]) if name.startswith("events.") else SPAN_COLUMNS.get(name[6:])
            if expected is None or dt != expected or offset < 0 or length < 0:
                raise TraceFormatError(f"trace column {name!r} is unknown or has the wrong type")
            if offset + length * dt.itemsize > payload_bytes:
                raise TraceFormatError(f"trace column {name!r} runs past end of payload")
            arrays[name] = np.frombuffer(payload, dtype=dt, count=length, offset=offset)
        events = {k: arrays["events." + k] for k in EVENT_COLUMNS if "events." + k in arrays}
        spans = {k: arrays.get("spans." + k, np.zeros(0, dt)) for k, dt in SPAN_COLUMNS.items()}
        strings = [str(s) for s in header["strings"]]
        shapes = [tuple(int(d) for d in s) for s in header["shapes"]]
        devices = [str(d) for d in header["devices"]] or ["cpu"]
        metadata = header.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise TraceFormatError("trace metadata is corrupt")
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, TraceFormatError):
            raise
        raise TraceFormatError(f"trace header is corrupt ({exc.__class__.__name__}: {exc})") from None
    trace = Trace(events=events, spans=spans, strings=strings, shapes=shapes, devices=devices, metadata=metadata)
    _check_indices(trace)
    return trace


def _check_indices(trace: Trace) -> None:
    """Reject files whose index columns point outside their tables."""
    n_strings, n_shapes, n_devices = len(trace.strings), len(trace.shapes), len(trace.devices)
    checks = [
        (trace.events["module"], n_strings, "module"),
        (trace.events["op"], n_strings, "op"),
        (trace.events["dtype"], n_strings, "dtype"),
        (trace.events["shape"], n_shapes, "shape"),
        (trace.events["device"], n_devices, "device"),
        (trace.spans["name"], n_strings, "span name"),
        (trace.spans["fingerprint"], n_strings, "span fingerprint"),
    ]
    for column, limit, what in checks:
        if len(column) and (int(column.min()) < -1 or int(column.max()) >= limit):
            raise TraceFormatError(f"trace is corrupt ({what} index out of range)")
    enum_checks = [
        (trace.events["action"], len(Action), "action"),
        (trace.events["category"], len(Category), "category"),
        (trace.events["modality"], len(Modality), "modality"),
        (trace.events["phase"], len(Phase), "phase"),
        (trace.spans["kind"], len(SpanKind), "span kind"),
    ]
    for column, limit, what in enum_checks:
        if len(column) and int(column.max()) >= limit:
            raise TraceFormatError(f"trace is corrupt ({what} value out of range)")


def save(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write atomically: a crash mid-write never leaves a file that looks complete."""
    path = Path(path)
    data = dumps(trace)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def load(path: str | os.PathLike[str]) -> Trace:
    with open(path, "rb") as fh:
        data = fh.read()
    return loads(data)
