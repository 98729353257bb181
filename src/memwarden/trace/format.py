"""The ``.mwtrace`` byte layout: ``dumps`` and ``loads`` (see docs/trace-format.md).

``loads`` validates as it parses: a file whose columns, indices or enum values point outside
their tables is refused with a ``TraceFormatError`` naming the reason, so every analysis can
index without checks.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from typing import Any

import numpy as np

from memwarden.trace.model import EVENT_COLUMNS, SPAN_COLUMNS, Trace, TraceFormatError
from memwarden.trace.validate import check_trace

__all__ = ["FORMAT_MAGIC", "FORMAT_VERSION", "dumps", "loads"]

FORMAT_MAGIC = b"MWTRACE\0"
FORMAT_VERSION = 1
_ALIGN = 64  # column payloads start on 64-byte boundaries so np.frombuffer is zero-copy
_HEADER_LIMIT_BYTES = 256 * 1024 * 1024  # refuse absurd headers before parsing them
# JSON arrays and objects a header may hold: one per 16 bytes, at least a million. Each becomes a Python
# object of 56+ bytes from as little as 3 bytes of JSON ("[],"): 30 MB of empty shapes took 870 MB.
# Real headers hold a few per hundred bytes (strings dominate; shapes are interned, so distinct).
_CONTAINERS_PER_BYTE = 1 / 16
_MIN_CONTAINERS = 1 << 20


def _refuse_constant(name: str) -> Any:
    raise TraceFormatError(f"trace header is corrupt (it holds {name}, which is not JSON)")


def _finite(value: Any, depth: int = 0) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN or Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth > 500:  # deeper than loads accepts; json.dumps will say so
        return value
    if isinstance(value, dict):
        return {k: _finite(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v, depth + 1) for v in value]
    return value


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
    # A non-finite float (a NaN that came in through a snapshot, say) is not JSON and loads refuses
    # it: written as null, so what is saved can always be loaded.
    header_bytes = json.dumps(_finite(header), separators=(",", ":"), allow_nan=False).encode()
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
    header_bytes = bytes(view[fixed : fixed + header_len])
    containers = header_bytes.count(b"[") + header_bytes.count(b"{")
    if containers > max(_MIN_CONTAINERS, header_len * _CONTAINERS_PER_BYTE):
        raise TraceFormatError(f"trace header is corrupt ({containers} arrays and objects in {header_len} bytes)")
    try:
        header = json.loads(header_bytes, parse_constant=_refuse_constant)
    except TraceFormatError:
        raise
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
            if offset % _ALIGN:
                raise TraceFormatError(
                    f"trace column {name!r} is not aligned (offset {offset}, not a multiple of {_ALIGN})"
                )
            if offset + length * dt.itemsize > payload_bytes:
                raise TraceFormatError(f"trace column {name!r} runs past end of payload")
            arrays[name] = np.frombuffer(payload, dtype=dt, count=length, offset=offset)
        events = {k: arrays["events." + k] for k in EVENT_COLUMNS if "events." + k in arrays}
        spans = {k: arrays.get("spans." + k, np.zeros(0, dt)) for k, dt in SPAN_COLUMNS.items()}
        strings = [str(s) for s in header["strings"]]
        shapes = [tuple(_dim(d) for d in s) for s in header["shapes"]]
        devices = [str(d) for d in header["devices"]] or ["cpu"]
        metadata = header.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise TraceFormatError("trace metadata is corrupt")
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, TraceFormatError):
            raise
        raise TraceFormatError(f"trace header is corrupt ({exc.__class__.__name__}: {exc})") from None
    trace = Trace(events=events, spans=spans, strings=strings, shapes=shapes, devices=devices, metadata=metadata)
    check_trace(trace)
    return trace


def _dim(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceFormatError(f"trace header is corrupt (shape dimension {str(value)[:20]!r} is not an integer)")
    return value
