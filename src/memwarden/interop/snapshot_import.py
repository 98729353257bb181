"""A PyTorch memory snapshot, already unpickled into plain objects, converted to a Trace.

``snapshot_to_trace`` walks the dicts and lists once (``_Importer``), checking
every field it uses as it converts it: types, ranges, block states, and items
per byte of pickle against lists shared by reference (a decompression bomb).
Frames become attribution: snapshots memwarden wrote carry it exactly, in the
two frames per block that ``memwarden.interop.snapshot_export`` writes; for
others the op and module are guessed from the innermost frames. Field meanings
follow torch/cuda/memory.py and torch/csrc/cuda/memory_snapshot.cpp. Reading
the file and the restricted unpickler are in ``memwarden.interop.snapshot``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memwarden.errors import InputError
from memwarden.trace.model import (
    EVENT_COLUMNS,
    Action,
    Category,
    Modality,
    Phase,
    SpanKind,
    Trace,
    TraceBuilder,
    TraceFormatError,
    parse_enum,
)
from memwarden.trace.validate import MAX_EVENT_BYTES, MAX_TIME_US, check_trace

EXPORT_MARKER = "memwarden"  # top-level key of snapshots memwarden wrote; torch's tools ignore it

# Sizes and times are held to what a loaded .mwtrace may hold (trace.validate), so every command
# after the import sees the values it would see from a trace file: no 2**62-byte malloc reaches the
# allocator model, no 2**63-µs time a subtraction.
_MAX_BYTES = MAX_EVENT_BYTES
_MAX_ADDR = 2**64 - 1
MAX_DEVICE = 4096
_FRAMES_SCANNED = 64  # attribution reads the innermost frames only
# The work budget of one import, in units of about one small Python object made or one 32-character
# stretch of string walked: WORK_PER_BYTE per byte of the file, and a floor for tiny files. A pickle's
# memo lets one byte (DUP) or two (BINGET) stand for a whole entry or frame already made, so the work a
# file causes is not its size: an entry costs ITEM_WORK (the event row and its objects), a frame
# attribution reads costs 1 + its strings' length / 32. Legitimate snapshots cost ~1-2 units per byte
# (entries take ≥ 40 bytes each; torch shares frame lists, converted once each).
WORK_PER_BYTE = 16
_WORK_FLOOR = 1 << 20
_ITEM_WORK = 64
_BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")
_ACTIVE_STATES = ("active_allocated", "active_pending_free")
_KNOWN_ACTIONS = frozenset(
    "alloc free_requested free_completed segment_alloc segment_free segment_map segment_unmap oom snapshot".split()
)
# Frames torch's viewer hides (interpreter and unwinder internals, MemoryViz.js frameFilter): never an op name.
_OMIT_FUNCTIONS = tuple(
    "unwind::unwind CapturedTraceback::gather gather_with_cpp _start __libc_start_main PyEval_ PyObject_ PyFunction_".split()
)
_OMIT_FILENAMES = tuple(
    "core/boxing /Register /Redispatch pythonrun.c Modules/main.c Objects/call.c Objects/methodobject.c "
    "pycore_ceval.h ceval.c cpython/abstract.h".split()
)


# -- structural checks ----------------------------------------------------------------


def _bad(where: str, what: str) -> InputError:
    return InputError(f"malformed snapshot: {where} {what}")


def _int(d: dict[Any, Any], key: str, where: str, *, hi: int = _MAX_BYTES, default: int | None = None) -> int:
    value = d.get(key, default)
    if value is None:
        raise _bad(where, f"has no {key!r}")
    if type(value) is not int:
        raise _bad(where, f"{key!r} must be an integer, got {type(value).__name__}")
    if not 0 <= value <= hi:
        raise _bad(where, f"{key!r} is out of range ({value}; expected 0..{hi})")
    return value


def _list(d: dict[Any, Any], key: str, where: str) -> list[Any]:
    if key not in d:
        raise _bad(where, f"has no {key!r}")
    value = d[key]
    if not isinstance(value, list):
        raise _bad(where, f"{key!r} must be a list, got {type(value).__name__}")
    return value


def _dict(value: Any, where: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise _bad(where, f"must be a dict, got {type(value).__name__}")
    return value


def _plain_settings(value: Any, depth: int = 0) -> Any:
    """Keep JSON-able scalars and small dicts of them (allocator settings go into Trace.metadata)."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, dict) and depth < 2:
        return {str(k): _plain_settings(v, depth + 1) for k, v in list(value.items())[:128] if isinstance(k, str | int)}
    return None


# -- attribution from frames --------------------------------------------------------


@dataclass(frozen=True)
class _Attribution:
    module: str | None = None
    op: str | None = None
    category: Category = Category.OTHER
    modality: Modality = Modality.SHARED
    phase: Phase = Phase.OTHER
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    file_backed: bool = False  # memwarden's MAP/UNMAP (mmap'd files), exported as alloc/free


_NO_ATTRIBUTION = _Attribution()


def _frame_kept(name: str, filename: str) -> bool:
    return not any(f in name for f in _OMIT_FUNCTIONS) and not any(f in filename for f in _OMIT_FILENAMES)


def _module_from_filename(filename: str) -> str | None:
    """'/x/site-packages/transformers/models/clip/modeling_clip.py' -> 'transformers.models.clip.modeling_clip'."""
    path = filename.replace("\\", "/")
    if not path.endswith(".py"):
        return None
    for root in ("site-packages/", "dist-packages/"):
        if root in path:
            path = path.rsplit(root, 1)[1]
            break
    else:
        path = path.rsplit("/", 1)[-1]
    dotted = path[:-3].replace("/", ".").removesuffix(".__init__")
    return dotted or None


class _Work:
    """What an import may still do; ``spend`` raises one InputError past it."""

    def __init__(self, data_bytes: int) -> None:
        self.left = WORK_PER_BYTE * max(0, data_bytes) + _WORK_FLOOR
        self.data_bytes = data_bytes

    def spend(self, units: int, what: str) -> None:
        self.left -= units
        if self.left < 0:
            raise _bad(
                "snapshot",
                f"{what} take more work than a {self.data_bytes}-byte file can hold "
                "(objects shared by reference many times over: a pickle bomb): refused",
            )


def _string_work(*values: Any) -> int:
    return 1 + sum(len(v) for v in values if isinstance(v, str)) // 32


def _guess_attribution(frames: list[Any], where: str, work: _Work) -> _Attribution:
    """op = innermost kept frame's function; module = innermost Python file outside torch."""
    op = module = None
    for frame in frames[:_FRAMES_SCANNED]:
        frame = _dict(frame, f"{where} frame")
        name, filename = frame.get("name"), frame.get("filename")
        if not isinstance(name, str) or not isinstance(filename, str):
            raise _bad(f"{where} frame", "needs string 'name' and 'filename'")
        work.spend(_string_work(name, filename), "its stack frames")
        if not _frame_kept(name, filename):
            continue
        op = op or name
        if module is None and "/torch/" not in filename.replace("\\", "/"):
            module = _module_from_filename(filename)
        if op and module:
            break
    return _Attribution(module=module, op=op) if (op or module) else _NO_ATTRIBUTION


def _memwarden_attribution(frames: list[Any], work: _Work) -> _Attribution:
    """Read back the two frames ``snapshot_export._export_frames`` writes; anything odd falls back to defaults."""
    if not frames or not isinstance(frames[0], dict):
        return _NO_ATTRIBUTION
    module, op = frames[0].get("filename"), frames[0].get("name")
    second = frames[1].get("name") if len(frames) > 1 and isinstance(frames[1], dict) else None
    work.spend(_string_work(module, op, second), "its stack frames")
    fields: dict[str, str] = {}
    if len(frames) > 1 and isinstance(frames[1], dict) and isinstance(frames[1].get("name"), str):
        fields = dict(tok.split("=", 1) for tok in frames[1]["name"].split() if "=" in tok)

    def enum(cls: Any, key: str, default: Any) -> Any:
        try:
            return parse_enum(cls, fields[key]) if key in fields else default
        except ValueError:
            return default

    shape = None
    if fields.get("shape"):
        try:
            shape = tuple(int(d) for d in fields["shape"].split("x"))
        except ValueError:
            shape = None
    return _Attribution(
        module=module if isinstance(module, str) and module != "<no module>" else None,
        op=op if isinstance(op, str) and op != "<no op>" else None,
        category=enum(Category, "category", Category.OTHER),
        modality=enum(Modality, "modality", Modality.SHARED),
        phase=enum(Phase, "phase", Phase.OTHER),
        dtype=fields.get("dtype") or None,
        shape=shape,
        file_backed=fields.get("memory") == "file",
    )


# -- import -------------------------------------------------------------------------


@dataclass
class _Block:
    tensor: int
    nbytes: int
    attribution: _Attribution
    free_requested_us: int | None = None


@dataclass
class _Importer:
    """Walks a snapshot once, checking each field as it converts it."""

    ours: bool  # written by memwarden: frames carry exact attribution
    synthetic_segments: bool  # memwarden invented one segment per block: not real reserved memory
    device_names: dict[int, str]
    builder: TraceBuilder = field(default_factory=lambda: TraceBuilder(devices=()))
    next_id: int = 0
    start_us: int = 0
    skipped: int = 0
    ooms: list[dict[str, Any]] = field(default_factory=list)
    frames_cache: dict[int, _Attribution] = field(default_factory=dict)
    work: _Work = field(default_factory=lambda: _Work(0))
    early: list[tuple[Any, ...]] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def device(self, index: int) -> str:
        return self.device_names.get(index, f"cuda:{index}")

    def attribution(self, d: dict[Any, Any], where: str) -> _Attribution:
        frames = d.get("frames")
        if frames is None:
            return _NO_ATTRIBUTION
        if not isinstance(frames, list):
            raise _bad(where, f"'frames' must be a list, got {type(frames).__name__}")
        # torch shares one frames list between entries with the same stack: convert each once
        cached = self.frames_cache.get(id(frames))
        if cached is None:
            cached = (
                _memwarden_attribution(frames, self.work) if self.ours else _guess_attribution(frames, where, self.work)
            )
            self.frames_cache[id(frames)] = cached
        return cached

    def event(self, t: int, action: Action, tensor: int, addr: int, nbytes: int, dev: str, a: _Attribution) -> None:
        row = (t, action, tensor, addr, nbytes, dev, a)
        # what existed before the ring buffer goes first among events at the start time
        (
            self.early if t == self.start_us and action in (Action.PREEXISTING, Action.SEGMENT_ALLOC) else self.rows
        ).append(row)

    def build(self) -> Trace:
        """Columns straight from the rows: TraceBuilder.event per row costs ~10 µs, this ~1."""
        b = self.builder
        interned: dict[_Attribution, tuple[int, ...]] = {}
        for a in {row[6] for row in self.rows} | {row[6] for row in self.early}:
            interned[a] = (
                int(a.category),
                int(a.modality),
                int(a.phase),
                b.intern(a.module),
                b.intern(a.op),
                b.intern(a.dtype),
                b.intern_shape(a.shape),
            )
        device_ids = {name: b.device(name) for name in {row[5] for row in self.rows} | {row[5] for row in self.early}}
        rows = [
            (t, int(act), tensor, addr, n, device_ids[dev], *interned[a])
            for t, act, tensor, addr, n, dev, a in self.early + self.rows
        ]
        skeleton = b.build()  # strings, shapes, devices, spans and metadata
        # each row's layout; the Trace fills the other columns
        names: tuple[str, ...] = ("time_us", "action", "tensor", "address", "nbytes", "device")
        names += ("category", "modality", "phase", "module", "op", "dtype", "shape")
        columns = zip(*rows, strict=True) if rows else [()] * len(names)
        events = {k: np.asarray(v, dtype=EVENT_COLUMNS[k]) for k, v in zip(names, columns, strict=True)}
        order = np.argsort(events["time_us"], kind="stable")  # as TraceBuilder.build does
        events = {k: v[order] for k, v in events.items()}
        return skeleton.with_events(events)

    def device_trace(self, index: int, entries: list[Any]) -> tuple[set[int], dict[int, int]]:
        """Convert one device's ring buffer.

        Returns the addresses of blocks the trace accounts for at its end (live,
        or with a free requested but not completed) and the segment bytes it
        leaves mapped, by address.
        """
        dev = self.device(index)
        live: dict[int, _Block] = {}  # addr -> block
        segs: dict[int, tuple[int, int]] = {}  # addr -> (id, bytes)
        t = self.start_us
        for k, raw in enumerate(entries):
            where = f"device_traces[{index}][{k}]"
            e = _dict(raw, where)
            action = e.get("action")
            if not isinstance(action, str):
                raise _bad(where, "has no string 'action'")
            if action not in _KNOWN_ACTIONS:
                self.skipped += 1
                continue
            t = _int(
                e, "time_us", where, hi=MAX_TIME_US, default=t + 1 if k else t
            )  # snapshots before torch 2.1 have no times
            size = _int(e, "size", where, default=0)
            a = self.attribution(e, where)
            if action == "oom":
                free = _int(e, "device_free", where, default=0)
                self.event(t, Action.OOM, self.new_id(), 0, size, dev, a)
                self.ooms.append({"device": dev, "time_us": t, "requested_bytes": size, "device_free_bytes": free})
                continue
            if action == "snapshot":
                self.builder.span(t, t, SpanKind.MARK, "snapshot")
                continue
            addr = _int(e, "addr", where, hi=_MAX_ADDR)
            if action == "alloc":
                old = live.pop(addr, None)
                if old is not None:  # its free fell out of the ring buffer, or only free_requested came
                    self.close(old, addr, dev, t)
                block = live[addr] = _Block(self.new_id(), size, a)
                self.event(t, Action.MAP if a.file_backed else Action.ALLOC, block.tensor, addr, size, dev, a)
            elif action == "free_requested":
                block = live.get(addr) or self.preexisting(live, addr, size, dev, a)
                block.free_requested_us = t
            elif action == "free_completed":
                popped = live.pop(addr, None)
                block = popped or self.preexisting({}, addr, size, dev, a)
                self.close(block, addr, dev, t, completed=True)
            elif self.synthetic_segments and action.startswith("segment_"):
                continue
            elif action in ("segment_alloc", "segment_map"):
                segs[addr] = (self.new_id(), size)
                self.event(t, Action.SEGMENT_ALLOC, segs[addr][0], addr, size, dev, a)
            else:  # segment_free / segment_unmap
                seg_id, seg_bytes = segs.pop(addr, (0, size))
                if not seg_id:  # reserved before the ring buffer starts
                    seg_id = self.new_id()
                    self.event(self.start_us, Action.SEGMENT_ALLOC, seg_id, addr, size, dev, _NO_ATTRIBUTION)
                self.event(t, Action.SEGMENT_FREE, seg_id, addr, seg_bytes, dev, a)
        for addr, block in live.items():
            if block.free_requested_us is not None:  # free requested, never completed: take the request
                self.close(block, addr, dev, block.free_requested_us)
        return set(live), {addr: nbytes for addr, (_, nbytes) in segs.items()}

    def preexisting(self, live: dict[int, _Block], addr: int, size: int, dev: str, a: _Attribution) -> _Block:
        block = live[addr] = _Block(self.new_id(), size, a)
        self.event(self.start_us, Action.PREEXISTING, block.tensor, addr, size, dev, a)
        return block

    def close(self, block: _Block, addr: int, dev: str, t: int, completed: bool = False) -> None:
        when = t if completed or block.free_requested_us is None else block.free_requested_us
        action = Action.UNMAP if block.attribution.file_backed else Action.FREE
        self.event(when, action, block.tensor, addr, block.nbytes, dev, block.attribution)

    def segments(
        self, segments: list[Any], live_at_end: dict[int, set[int]], segs_at_end: dict[int, dict[int, int]]
    ) -> dict[str, int]:
        """Active blocks with no alloc in the ring buffer become PREEXISTING; so does older reserved memory."""
        reserved = allocated = 0
        for si, raw in enumerate(segments):
            where = f"segments[{si}]"
            seg = _dict(raw, where)
            index = _int(seg, "device", where, hi=MAX_DEVICE)
            dev = self.device(index)
            seg_addr = _int(seg, "address", where, hi=_MAX_ADDR)
            total = _int(seg, "total_size", where)
            _int(seg, "stream", where, hi=_MAX_ADDR, default=0)
            reserved += total
            traced = sum(n for a, n in segs_at_end.get(index, {}).items() if seg_addr <= a < seg_addr + total)
            if total > traced and not self.synthetic_segments:
                self.event(
                    self.start_us, Action.SEGMENT_ALLOC, self.new_id(), seg_addr, total - traced, dev, _NO_ATTRIBUTION
                )
            live = live_at_end.get(index, set())
            cursor = seg_addr
            for bi, braw in enumerate(_list(seg, "blocks", where)):
                bwhere = f"{where}.blocks[{bi}]"
                block = _dict(braw, bwhere)
                size = _int(block, "size", bwhere)
                addr = _int(block, "address", bwhere, hi=_MAX_ADDR, default=cursor)
                requested = _int(block, "requested_size", bwhere, default=size)
                state = block.get("state")
                if state not in _BLOCK_STATES:
                    raise _bad(bwhere, f"has unknown state (expected one of {', '.join(_BLOCK_STATES)})")
                cursor = addr + size
                if state == "active_allocated":
                    allocated += size
                if state in _ACTIVE_STATES and addr not in live:
                    a = self.attribution(block, bwhere)
                    self.event(self.start_us, Action.PREEXISTING, self.new_id(), addr, requested, dev, a)
        return {"reserved_bytes": reserved, "allocated_bytes": allocated}


def snapshot_to_trace(obj: Any, data_bytes: int) -> Trace:
    if not isinstance(obj, dict):
        raise InputError(f"not a PyTorch memory snapshot: top level is a {type(obj).__name__}, expected a dict")
    where = "snapshot"
    segments = _list(obj, "segments", where)
    device_traces = _list(obj, "device_traces", where)
    for i, entries in enumerate(device_traces):
        if not isinstance(entries, list):
            raise _bad(f"device_traces[{i}]", f"must be a list, got {type(entries).__name__}")
    if len(device_traces) > MAX_DEVICE:
        raise _bad("device_traces", f"lists {len(device_traces)} devices")
    # Every entry and block is work (an event row and its objects); a file's size bounds how many it may
    # hold, whatever its memo shares (one entry DUPed a million times is a million rows to make).
    work = _Work(data_bytes)
    items = len(segments) + sum(len(entries) for entries in device_traces)
    items += sum(len(s["blocks"]) for s in segments if isinstance(s, dict) and isinstance(s.get("blocks"), list))
    work.spend(items * _ITEM_WORK, f"its {items} entries and blocks")

    marker = obj.get(EXPORT_MARKER)
    names: dict[int, str] = {}
    if isinstance(marker, dict) and isinstance(marker.get("devices"), list):
        names = {i: n for i, n in enumerate(marker["devices"]) if isinstance(n, str) and n}
    ours = isinstance(marker, dict)
    per_block = isinstance(marker, dict) and marker.get("segments") == "per-block"
    imp = _Importer(ours=ours, synthetic_segments=per_block, device_names=names, work=work)
    times = [
        e["time_us"]
        for entries in device_traces
        for e in entries
        if isinstance(e, dict) and type(e.get("time_us")) is int
    ]
    if isinstance(marker, dict) and type(marker.get("start_us")) is int:
        times.append(marker["start_us"])  # a PREEXISTING block may predate every entry
    imp.start_us = min(times, default=0)
    used = sorted({i for i, entries in enumerate(device_traces) if entries})
    used += sorted({s["device"] for s in segments if isinstance(s, dict) and type(s.get("device")) is int} - set(used))
    for i in used:
        if 0 <= i <= MAX_DEVICE:
            imp.builder.device(imp.device(i))

    live_at_end: dict[int, set[int]] = {}
    segs_at_end: dict[int, dict[int, int]] = {}
    for i, entries in enumerate(device_traces):
        live_at_end[i], segs_at_end[i] = imp.device_trace(i, entries)
    totals = imp.segments(segments, live_at_end, segs_at_end)

    imp.builder.metadata.update(
        {
            "source": "torch-snapshot",
            "snapshot": {
                "segments": len(segments),
                "trace_entries": sum(len(entries) for entries in device_traces),
                "skipped_entries": imp.skipped,
                **totals,
            },
        }
    )
    if isinstance(obj.get("allocator_settings"), dict):
        imp.builder.metadata["allocator_settings"] = _plain_settings(obj["allocator_settings"])
    if imp.ooms:
        imp.builder.metadata["ooms"] = imp.ooms
    if not imp.builder.devices:
        imp.builder.device("cuda:0")
    trace = imp.build()
    try:  # the checks every loaded .mwtrace passes: what a command relies on holds for snapshots too
        check_trace(trace)
    except TraceFormatError as exc:
        raise _bad(
            "snapshot", f"converts to an unusable trace ({str(exc).removeprefix('trace is corrupt ')})"
        ) from None
    return trace
