"""The ``.mwtrace`` stream: a capture's log appended chunk by chunk while the process runs, so a
process killed mid-run still leaves everything up to its last flush (see docs/trace-format.md).

A stream file is ``STREAM_MAGIC`` (8 bytes), a little-endian u32 version and a u32 reserved word,
then chunks. A chunk is a 20-byte frame ``<4sIQI`` (``b"MWCK"``, JSON length, binary length,
CRC-32 of JSON + binary), a JSON object, then the binary columns it describes, back to back. A
chunk is written with one ``write`` call, so a killed writer leaves whole chunks and at most one
torn one at the end; ``read_stream`` keeps every chunk whose frame and checksum are whole and
stops at the first that is not.

The chunks carry the recorder's raw rows (``RAW_EVENT_DTYPE``, the native ``Event`` struct) and
the Python side's observations; the capture layer turns them into a fully attributed Trace
(``memwarden.record.live.recover``). ``trace_from_stream`` here needs neither torch nor the
capture layer: it makes a Trace with every byte in it and the attribution the stream alone
allows (module, op, dtype, shape, tags, step phases), for ``memwarden.load`` of a stream whose
writer and supervisor both died.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memwarden.trace.model import (
    EVENT_COLUMNS,
    Action,
    Category,
    Modality,
    Phase,
    SpanKind,
    Trace,
    TraceBuilder,
    enum_name,
)
from memwarden.trace.sites import split_site
from memwarden.trace.steps import Step, steps_metadata

__all__ = [
    "RAW_EVENT_DTYPE",
    "STREAM_MAGIC",
    "StreamLog",
    "encode_chunk",
    "read_stream",
    "stream_header",
    "trace_from_stream",
]

STREAM_MAGIC = b"MWSTREAM"
STREAM_VERSION = 1
_CHUNK_MAGIC = b"MWCK"
_FRAME = struct.Struct("<4sIQI")
_JSON_LIMIT = 64 * 1024 * 1024

# One recorder row exactly as native.cpp's ``struct Event`` lays it out (static_assert there).
RAW_EVENT_DTYPE = np.dtype(
    {
        "names": [
            "t_ns",
            "ptr",
            "nbytes",
            "id",
            "ctx",
            "op_outer",
            "op_inner",
            "shape_off",
            "ndim",
            "dtype",
            "action",
            "site",
            "written",
        ],
        "formats": ["<i8", "<i8", "<i8", "<i8", "<i4", "<i4", "<i4", "<i4", "<i2", "i1", "u1", "<i4", "<i8"],
        "offsets": [0, 8, 16, 24, 32, 36, 40, 44, 48, 50, 51, 52, 56],
        "itemsize": 64,
    }
)

_SAVED = "saved"  # the tag of a tensor autograd saved for backward: no category of its own
_NOT_ACTIVATIONS = {int(Category.WEIGHT), int(Category.BUFFER), int(Category.GRADIENT), int(Category.OPTIMIZER_STATE)}
_TAG_CATEGORY = {
    "weight": Category.WEIGHT,
    "buffer": Category.BUFFER,
    "gradient": Category.GRADIENT,
    "optimizer_state": Category.OPTIMIZER_STATE,
    "kv_cache": Category.KV_CACHE,
    "input": Category.INPUT,
}


def stream_header() -> bytes:
    return STREAM_MAGIC + struct.pack("<II", STREAM_VERSION, 0)


def encode_chunk(header: dict[str, Any], columns: Sequence[tuple[str, np.ndarray]] = ()) -> bytes:
    """One chunk: frame, JSON (``header`` plus the column table), the columns' bytes."""
    table = [{"name": n, "dtype": a.dtype.str, "length": int(len(a))} for n, a in columns]
    body = json.dumps({**header, "columns": table}, separators=(",", ":")).encode()
    binary = b"".join(np.ascontiguousarray(a).tobytes() for _, a in columns)
    crc = zlib.crc32(binary, zlib.crc32(body))
    return _FRAME.pack(_CHUNK_MAGIC, len(body), len(binary), crc) + body + binary


@dataclass
class StreamLog:
    """Everything the complete chunks of a stream hold, merged in order."""

    start: dict[str, Any] = field(default_factory=dict)
    rows: list[np.ndarray] = field(default_factory=list)  # RAW_EVENT_DTYPE arrays, one per chunk
    shape_pool: list[int] = field(default_factory=list)
    op_names: list[str] = field(default_factory=list)
    site_names: list[str] = field(default_factory=list)  # recorder sites (trace.sites.split_site)
    modules: list[list[Any]] = field(default_factory=list)  # ctx -> [path, label, modality]
    tags: list[list[Any]] = field(default_factory=list)  # [t_ns, ptr, kind, path]
    fingerprints: list[str | None] = field(default_factory=list)
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    optimizer: dict[int, list[int]] = field(default_factory=dict)
    storages: dict[str, dict[str, Any]] = field(default_factory=dict)  # "pre:ptr"/"map:ptr" -> record
    resident: list[dict[str, int]] = field(default_factory=list)
    annotations: list[dict[str, Any]] = field(default_factory=list)
    last_t_ns: int = 0
    chunks: int = 0
    complete: bool = False  # an "end" chunk was read
    dropped_bytes: int = 0  # bytes after the last whole chunk (a torn write, or garbage)

    def raw_rows(self) -> np.ndarray:
        return np.concatenate(self.rows) if self.rows else np.zeros(0, RAW_EVENT_DTYPE)

    @property
    def t0_ns(self) -> int:
        return int(self.start.get("t0_ns", 0))

    def recovery_note(self) -> dict[str, Any]:
        return {
            "from": "stream",
            "chunks": self.chunks,
            "complete": self.complete,
            "dropped_bytes": self.dropped_bytes,
            "last_flush_us": max(0, (self.last_t_ns - self.t0_ns) // 1000),
        }


def _columns(table: Any, binary: memoryview) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    offset = 0
    for desc in table:
        dt = np.dtype(str(desc["dtype"]))
        length = int(desc["length"])
        size = length * dt.itemsize
        if length < 0 or offset + size > len(binary):
            raise ValueError("column runs past its chunk")
        out[str(desc["name"])] = np.frombuffer(binary[offset : offset + size], dtype=dt).copy()
        offset += size
    return out


def _merge(log: StreamLog, head: dict[str, Any], cols: dict[str, np.ndarray]) -> None:
    kind = head.get("kind")
    if kind == "start":
        log.start = head
    if "events" in cols:
        log.rows.append(cols["events"].view(RAW_EVENT_DTYPE))
    if "shapes" in cols:
        log.shape_pool.extend(cols["shapes"].astype(np.int64).tolist())
    log.op_names.extend(str(s) for s in head.get("ops", ()))
    log.site_names.extend(str(s) for s in head.get("sites", ()))
    log.modules.extend(list(m) for m in head.get("modules", ()))
    log.tags.extend(list(t) for t in head.get("tags", ()))
    log.fingerprints.extend(head.get("fingerprints", ()))
    for index, step in head.get("steps", ()):  # streams written before steps went as rows
        log.steps[int(index)] = dict(step)
    fields = [str(f) for f in head.get("step_fields", ())]
    for row in head.get("step_rows", ()):
        log.steps[int(row[0])] = dict(zip(fields, row[1:], strict=True))
    for index, span in head.get("optimizer", ()):
        log.optimizer[int(index)] = [int(span[0]), int(span[1])]
    for key, rec in head.get("storages", ()):
        log.storages[str(key)] = dict(rec)
    for key, freed_ns in head.get("freed", ()):
        if str(key) in log.storages:
            log.storages[str(key)]["freed_ns"] = int(freed_ns)
    log.resident.extend(dict(r) for r in head.get("resident", ()))
    log.annotations.extend(head.get("annotations", ()))
    log.last_t_ns = max(log.last_t_ns, int(head.get("t_ns", 0)))
    log.complete |= kind == "end"
    log.chunks += 1


def read_stream(data: bytes | memoryview) -> StreamLog:
    """Every whole chunk of a stream, merged; raises ``ValueError`` if ``data`` is not a stream."""
    view = memoryview(data)
    if bytes(view[: len(STREAM_MAGIC)]) != STREAM_MAGIC or len(view) < len(STREAM_MAGIC) + 8:
        raise ValueError("not a memwarden stream (bad magic bytes)")
    (version, _) = struct.unpack("<II", view[len(STREAM_MAGIC) : len(STREAM_MAGIC) + 8])
    if version != STREAM_VERSION:
        raise ValueError(f"unsupported stream version {version} (this memwarden reads {STREAM_VERSION})")
    log = StreamLog()
    pos = len(STREAM_MAGIC) + 8
    while pos + _FRAME.size <= len(view):
        magic, json_len, bin_len, crc = _FRAME.unpack(view[pos : pos + _FRAME.size])
        end = pos + _FRAME.size + json_len + bin_len
        if magic != _CHUNK_MAGIC or json_len > _JSON_LIMIT or end > len(view):
            break
        body = view[pos + _FRAME.size : pos + _FRAME.size + json_len]
        binary = view[pos + _FRAME.size + json_len : end]
        if zlib.crc32(binary, zlib.crc32(body)) != crc:
            break
        try:
            head = json.loads(bytes(body))
            if not isinstance(head, dict):
                break
            cols = _columns(head.get("columns", ()), binary)
            _merge(log, head, cols)
        except (ValueError, TypeError, KeyError, IndexError):
            break
        pos = end
    log.dropped_bytes = len(view) - pos
    if not log.start:
        raise ValueError("stream holds no complete start chunk")
    return log


# -- a Trace from the stream alone (no capture layer) ------------------------------------


def _blocks(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ALLOC rows, FREE rows kept, the block index of each kept FREE)."""
    allocs = np.flatnonzero(raw["action"] == 0)
    frees = np.flatnonzero(raw["action"] == 1)
    ids = raw["id"][allocs]
    if not len(allocs) or not len(frees):
        return allocs, frees[:0], frees[:0]
    pos = np.clip(np.searchsorted(ids, raw["id"][frees]), 0, len(allocs) - 1)
    hit = ids[pos] == raw["id"][frees]
    return allocs, frees[hit], pos[hit]


def _tag_categories(
    log: StreamLog, raw: np.ndarray, allocs: np.ndarray, free_ns: np.ndarray
) -> tuple[dict[int, Category], set[int]]:
    """Per block, the category its first tag names; and the blocks autograd saved for backward."""
    by_ptr: dict[int, list[int]] = {}
    for k, ptr in enumerate(raw["ptr"][allocs].tolist()):
        by_ptr.setdefault(int(ptr), []).append(k)
    alloc_ns = raw["t_ns"][allocs]
    found: dict[int, Category] = {}
    saved: set[int] = set()
    for t_ns, ptr, kind, _path in log.tags:
        category = _TAG_CATEGORY.get(str(kind))
        for k in reversed(by_ptr.get(int(ptr), ())):
            if alloc_ns[k] <= t_ns < free_ns[k]:
                if category is not None and k not in found:
                    found[k] = category
                elif kind == _SAVED:
                    saved.add(k)
                break
    return found, saved


def trace_from_stream(log: StreamLog, metadata: dict[str, Any] | None = None) -> Trace:
    """A Trace from the stream alone: every block the recorder logged, with what the stream says
    of it; ``metadata["recovered"]`` says it was recovered and how much of the stream was whole."""
    raw = log.raw_rows()
    t0 = log.t0_ns
    end_ns = max(log.last_t_ns, int(raw["t_ns"].max()) if len(raw) else t0)
    allocs, frees, free_block = _blocks(raw)
    free_ns = np.full(len(allocs), np.iinfo(np.int64).max, dtype=np.int64)
    free_ns[free_block] = raw["t_ns"][frees]
    meta = {**log.start.get("metadata", {}), **(metadata or {})}
    builder = TraceBuilder(devices=["cpu"], metadata=meta)
    labels = np.array([builder.intern(str(m[1])) for m in log.modules] + [-1], dtype=np.int32)
    modality = np.array([int(m[2]) for m in log.modules] + [int(Modality.SHARED)], dtype=np.int64)
    ops = np.array([builder.intern(s) for s in log.op_names] + [-1], dtype=np.int32)
    dtype_names = [str(s) for s in log.start.get("dtype_torch_names", ())]
    dtypes = np.array([builder.intern(s) for s in dtype_names] + [-1], dtype=np.int32)

    ctx = np.clip(raw["ctx"][allocs].astype(np.int64), -1, len(log.modules) - 1)
    category = np.where(free_ns < np.iinfo(np.int64).max, int(Category.TEMPORARY), int(Category.OTHER))
    category = np.where((free_ns == np.iinfo(np.int64).max) & (ctx >= 0), int(Category.ACTIVATION), category)
    found, saved = _tag_categories(log, raw, allocs, free_ns)
    for k, cat in found.items():
        category[k] = int(cat)
    kept = sorted(k for k in saved if category[k] not in _NOT_ACTIVATIONS)
    steps = sorted(log.steps.values(), key=lambda s: int(s["start_ns"]))
    step_start = np.array([int(s["start_ns"]) for s in steps], dtype=np.int64)
    step_phase = np.array([int(s["phase"]) for s in steps] + [int(Phase.LOAD)], dtype=np.int64)
    at = np.searchsorted(step_start, raw["t_ns"][allocs], side="right") - 1
    phase = np.where(at >= 0, step_phase[np.maximum(at, 0)], int(Phase.LOAD))
    shape = np.full(len(allocs), -1, dtype=np.int32)
    for k, (off, nd) in enumerate(zip(raw["shape_off"][allocs].tolist(), raw["ndim"][allocs].tolist(), strict=True)):
        if 0 <= off and off + nd <= len(log.shape_pool):
            shape[k] = builder.intern_shape(tuple(log.shape_pool[off : off + nd]))

    per_block = {
        "category": category.astype(np.uint8),
        "modality": modality[ctx].astype(np.uint8),
        "phase": phase.astype(np.uint8),
        "module": labels[ctx],
        "op": ops[np.clip(raw["op_outer"][allocs].astype(np.int64), -1, len(log.op_names) - 1)],
        "dtype": dtypes[np.clip(raw["dtype"][allocs].astype(np.int64), -1, len(dtype_names) - 1)],
        "shape": shape,
        "written_bytes": raw["written"][allocs],
        **_site_columns(builder, log, raw["site"][allocs]),
    }
    block_of = np.concatenate([np.arange(len(allocs)), free_block])
    rows = np.concatenate([allocs, frees])
    events: dict[str, np.ndarray] = {
        "time_us": np.maximum(0, (raw["t_ns"][rows] - t0) // 1000),
        "action": np.where(raw["action"][rows] == 0, int(Action.ALLOC), int(Action.FREE)).astype(np.uint8),
        "tensor": raw["id"][rows],
        "address": raw["ptr"][rows].astype(np.uint64),
        "nbytes": raw["nbytes"][rows],
        "device": np.zeros(len(rows), dtype=np.int16),
        **{k: v[block_of] for k, v in per_block.items()},
    }
    _side_events(builder, log, t0)
    records = []
    for step in steps:
        s_ns = int(step["start_ns"])
        e_ns = int(step["end_ns"]) if step.get("end_ns") is not None else end_ns
        start_us, end_us = max(0, (s_ns - t0) // 1000), max(0, (e_ns - t0) // 1000)
        builder.span(start_us, end_us, SpanKind.STEP, "step", phase=Phase(int(step["phase"])))
        records.append(_step_record(step, start_us, end_us, log))
    if records:  # as the capture records them (record/attribution/emit_spans.py ``step_records``)
        builder.metadata["steps"] = steps_metadata(records)
    builder.metadata["duration_us"] = max(0, (end_ns - t0) // 1000)
    builder.metadata["recovered"] = log.recovery_note()
    if kept:  # as the capture's own attribution names them (record/attribution/tags.py)
        builder.metadata["saved_for_backward"] = {
            "tensors": [int(i) for i in raw["id"][allocs][kept]],
            "nbytes": int(raw["nbytes"][allocs][kept].sum()),
        }
    if log.annotations:
        builder.metadata.setdefault("annotations", list(log.annotations))
    side = builder.build()
    merged = {k: np.concatenate([side.events[k], events[k].astype(EVENT_COLUMNS[k])]) for k in EVENT_COLUMNS}
    order = np.argsort(merged["time_us"], kind="stable")
    return side.with_events({k: v[order] for k, v in merged.items()})


def _step_record(step: dict[str, Any], start_us: int, end_us: int, log: StreamLog) -> Step:
    ctx = int(step.get("ctx", -1))
    tokens, ids, site = step.get("tokens"), step.get("input_ids"), step.get("call_site")
    return Step(
        phase=enum_name(Phase(int(step["phase"]))),
        start_us=start_us,
        end_us=end_us,
        module=str(log.modules[ctx][1]) if 0 <= ctx < len(log.modules) else "model",
        seq_len=step.get("seq_len"),
        batch=step.get("batch"),
        tokens=dict(tokens) if isinstance(tokens, dict) else {},
        input_ids=tuple(ids) if isinstance(ids, list) else (),
        grad=step.get("grad"),
        call_site=site if isinstance(site, str) else None,
        media_digests=tuple(str(x) for x in step.get("media_digests") or () if isinstance(x, str)),
    )


def _site_columns(builder: TraceBuilder, log: StreamLog, site: np.ndarray) -> dict[str, np.ndarray]:
    pairs = [split_site(s) for s in log.site_names]
    line_ids = np.array([builder.intern(p[0]) for p in pairs] + [-1], dtype=np.int32)
    stack_ids = np.array([builder.intern(p[1]) for p in pairs] + [-1], dtype=np.int32)
    index = np.where((site >= 0) & (site < len(pairs)), site, -1).astype(np.int64)
    return {"line": line_ids[index], "stack": stack_ids[index]}


def _side_events(builder: TraceBuilder, log: StreamLog, t0: int) -> None:
    """Storages the allocator never saw (alive before the capture, or mapped from a file); tensor
    ids -1, -2, ... as the capture gives them."""
    for i, (key, rec) in enumerate(sorted(log.storages.items())):
        mapped = key.startswith("map:") or bool(rec.get("file"))
        t_us = max(0, (int(rec.get("t_ns", t0)) - t0) // 1000) if key.startswith("map:") else 0
        category = Category.WEIGHT if mapped else Category.OTHER
        dtype, shape = rec.get("dtype"), tuple(int(d) for d in rec.get("shape", ()))
        ptr, nbytes, tensor = int(rec["ptr"]), int(rec["nbytes"]), -1 - i
        events = [(t_us, Action.MAP if mapped else Action.PREEXISTING)]
        if rec.get("freed_ns") is not None:  # and its end, never before its start
            events.append((max(t_us, (int(rec["freed_ns"]) - t0) // 1000), Action.UNMAP if mapped else Action.FREE))
        for t_event_us, action in events:
            builder.event(
                t_event_us,
                action,
                tensor,
                ptr,
                nbytes,
                category=category,
                phase=Phase.LOAD,
                op=rec.get("file"),
                dtype=dtype,
                shape=shape,
            )
