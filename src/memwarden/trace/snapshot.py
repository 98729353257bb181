"""PyTorch memory snapshots: safe import into a Trace, export for PyTorch's viewer.

A snapshot (``torch.cuda.memory._snapshot()`` / ``_dump_snapshot``) is a pickle
of plain dicts and lists: ``segments`` (allocator state when it was taken),
``device_traces`` (one ring buffer of allocator events per CUDA device) and
``allocator_settings``. Field meanings follow torch/cuda/memory.py and
torch/csrc/cuda/memory_snapshot.cpp.

Safety. A pickle is a program: GLOBAL/STACK_GLOBAL/INST/EXT opcodes fetch any
callable by name and REDUCE/NEWOBJ/BUILD call it. Every route to a callable goes
through ``Unpickler.find_class`` (or ``persistent_load``), so the unpickler
below refuses both and no code from a file ever runs. What is left (dict, list,
tuple, str, bytes, int, float, bool, None) is then checked field by field.

Export. ``to_snapshot`` writes a dict that PyTorch's own tools accept:
``python -m torch.cuda._memory_viz stats|trace|trace_plot|segment_plot``.
Their JavaScript viewer (torch/utils/viz/MemoryViz.js) reads pickle protocol
2-4 only, pairs blocks by address, and looks every live block up in a live
segment, so the export keeps addresses disjoint while live and, unless the
caller passes allocator segments, gives each block its own segment.
"""

from __future__ import annotations

import bisect
import io
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.errors import InputError
from memwarden.trace.io import atomic_write
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
    parse_enum,
)

__all__ = ["DEFAULT_MAX_SNAPSHOT_BYTES", "device_indices", "load_snapshot", "save_snapshot", "to_snapshot"]

DEFAULT_MAX_SNAPSHOT_BYTES = 1 << 30  # 1 GiB: a 100k-entry ring buffer with C++ stacks is ~100s of MiB
PICKLE_PROTOCOL = 4  # MemoryViz.js refuses protocol 5
EXPORT_MARKER = "memwarden"  # top-level key of snapshots memwarden wrote; torch's tools ignore it

_MAX_INT64 = 2**63 - 1
_MAX_ADDR = 2**64 - 1
_MAX_DEVICE = 4096
_FRAMES_SCANNED = 64  # attribution reads the innermost frames only
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
# torch's snapshot defaults (AllocatorConfigInfo): max_split_size SIZE_MAX reads back as -1.
_DEFAULT_ALLOCATOR_SETTINGS: dict[str, Any] = {
    "PYTORCH_CUDA_ALLOC_CONF": "",
    "max_split_size": -1,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
    "pinned_num_register_threads": 1,
    "release_lock_on_cudamalloc": False,
    "pinned_use_cuda_host_register": False,
    "roundup_power2_divisions": {},
}
_SYNTH_BASE_ADDR = 0x7F0000000000  # where invented addresses start: looks like a device pointer, < 2**53 for JS
_SYNTH_ALIGN = 512  # the CUDA caching allocator's minimum block size
_SYNTH_SEGMENT_GAP = 1 << 30  # invented addresses start this far past the given segments


# -- restricted unpickling --------------------------------------------------------------


class _Refused(Exception):
    """Raised inside the unpickler the moment a pickle asks for anything callable."""


_MODULE_ALIASES = {"posix": "os", "nt": "os"}  # os.system pickles as posix.system: name what the user wrote


class _NoGlobalsUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"{_MODULE_ALIASES.get(module, module)}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("an external object (persistent id)")


def _restricted_loads(data: bytes) -> Any:
    try:
        return _NoGlobalsUnpickler(io.BytesIO(data)).load()
    except _Refused as exc:
        raise InputError(f"refused: pickle references {exc}; memwarden never runs code from a file") from None
    except MemoryError:
        raise InputError("not a readable pickle (it declares sizes larger than memory)") from None
    except Exception as exc:  # no code ran, so any failure means a truncated or corrupt stream
        raise InputError(f"not a readable pickle ({exc.__class__.__name__}: truncated or corrupt)") from None


# -- structural checks ----------------------------------------------------------------


def _bad(where: str, what: str) -> InputError:
    return InputError(f"malformed snapshot: {where} {what}")


def _int(d: dict[Any, Any], key: str, where: str, *, hi: int = _MAX_INT64, default: int | None = None) -> int:
    value = d.get(key, default)
    if value is None:
        raise _bad(where, f"has no {key!r}")
    if type(value) is not int:
        raise _bad(where, f"{key!r} must be an integer, got {type(value).__name__}")
    if not 0 <= value <= hi:
        raise _bad(where, f"{key!r} is out of range ({value}): huge or negative declared size")
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


def _guess_attribution(frames: list[Any], where: str) -> _Attribution:
    """op = innermost kept frame's function; module = innermost Python file outside torch."""
    op = module = None
    for frame in frames[:_FRAMES_SCANNED]:
        frame = _dict(frame, f"{where} frame")
        name, filename = frame.get("name"), frame.get("filename")
        if not isinstance(name, str) or not isinstance(filename, str):
            raise _bad(f"{where} frame", "needs string 'name' and 'filename'")
        if not _frame_kept(name, filename):
            continue
        op = op or name
        if module is None and "/torch/" not in filename.replace("\\", "/"):
            module = _module_from_filename(filename)
        if op and module:
            break
    return _Attribution(module=module, op=op) if (op or module) else _NO_ATTRIBUTION


def _memwarden_attribution(frames: list[Any]) -> _Attribution:
    """Read back the two frames ``_export_frames`` writes; anything odd falls back to defaults."""
    if not frames or not isinstance(frames[0], dict):
        return _NO_ATTRIBUTION
    module, op = frames[0].get("filename"), frames[0].get("name")
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
            cached = _memwarden_attribution(frames) if self.ours else _guess_attribution(frames, where)
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
                int(a.category), int(a.modality), int(a.phase),
                b.intern(a.module), b.intern(a.op), b.intern(a.dtype), b.intern_shape(a.shape),
            )  # fmt: skip
        device_ids = {name: b.device(name) for name in {row[5] for row in self.rows} | {row[5] for row in self.early}}
        rows = [
            (t, int(act), tensor, addr, n, device_ids[dev], *interned[a])
            for t, act, tensor, addr, n, dev, a in self.early + self.rows
        ]
        skeleton = b.build()  # strings, shapes, devices, spans and metadata
        names = ("time_us", "action", "tensor", "address", "nbytes", "device")  # each row's layout
        names += ("category", "modality", "phase", "module", "op", "dtype", "shape")  # Trace fills other columns
        columns = zip(*rows, strict=True) if rows else [()] * len(names)
        events = {k: np.asarray(v, dtype=EVENT_COLUMNS[k]) for k, v in zip(names, columns, strict=True)}
        order = np.argsort(events["time_us"], kind="stable")  # as TraceBuilder.build does
        events = {k: v[order] for k, v in events.items()}
        return Trace(
            events=events, spans=skeleton.spans, strings=skeleton.strings, shapes=skeleton.shapes,
            devices=skeleton.devices, metadata=skeleton.metadata,
        )  # fmt: skip

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
            t = _int(e, "time_us", where, default=t + 1 if k else t)  # snapshots before torch 2.1 have no times
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
                block = live.pop(addr, None) or self.preexisting({}, addr, size, dev, a)
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
            index = _int(seg, "device", where, hi=_MAX_DEVICE)
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


def _read_source(source: str | os.PathLike[str] | bytes, max_bytes: int) -> tuple[str, bytes]:
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        label = "snapshot"
    else:
        label = str(source)
        try:
            with open(source, "rb") as fh:
                data = fh.read(max_bytes + 1)
        except FileNotFoundError:
            raise InputError(f"{label}: no such file") from None
        except IsADirectoryError:
            raise InputError(f"{label}: is a directory, not a snapshot") from None
        except OSError as exc:
            raise InputError(f"{label}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    if len(data) > max_bytes:
        raise InputError(f"{label}: snapshot is larger than the {max_bytes}-byte limit (raise max_bytes to read it)")
    return label, data


def load_snapshot(source: str | os.PathLike[str] | bytes, max_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES) -> Trace:
    """Read a PyTorch memory snapshot (path or bytes) into a Trace, running no code from it."""
    label, data = _read_source(source, max_bytes)
    try:
        return _snapshot_to_trace(_restricted_loads(data), len(data))
    except InputError as exc:
        raise InputError(f"{label}: {exc}") from None


def _snapshot_to_trace(obj: Any, data_bytes: int) -> Trace:
    if not isinstance(obj, dict):
        raise InputError(f"not a PyTorch memory snapshot: top level is a {type(obj).__name__}, expected a dict")
    where = "snapshot"
    segments = _list(obj, "segments", where)
    device_traces = _list(obj, "device_traces", where)
    for i, entries in enumerate(device_traces):
        if not isinstance(entries, list):
            raise _bad(f"device_traces[{i}]", f"must be a list, got {type(entries).__name__}")
    if len(device_traces) > _MAX_DEVICE:
        raise _bad("device_traces", f"lists {len(device_traces)} devices")
    # Each element costs at least one opcode byte unless whole lists are shared by
    # reference; a legitimate snapshot never shares them, a decompression bomb does.
    items = len(segments) + sum(len(entries) for entries in device_traces)
    items += sum(len(s["blocks"]) for s in segments if isinstance(s, dict) and isinstance(s.get("blocks"), list))
    if items > data_bytes:
        raise _bad("snapshot", f"holds {items} items in {data_bytes} bytes (shared lists): refused")

    marker = obj.get(EXPORT_MARKER)
    names: dict[int, str] = {}
    if isinstance(marker, dict) and isinstance(marker.get("devices"), list):
        names = {i: n for i, n in enumerate(marker["devices"]) if isinstance(n, str) and n}
    ours = isinstance(marker, dict)
    imp = _Importer(ours=ours, synthetic_segments=ours and marker.get("segments") == "per-block", device_names=names)
    times = [
        e["time_us"]
        for entries in device_traces
        for e in entries
        if isinstance(e, dict) and type(e.get("time_us")) is int
    ]
    if ours and type(marker.get("start_us")) is int:
        times.append(marker["start_us"])  # a PREEXISTING block may predate every entry
    imp.start_us = min(times, default=0)
    used = sorted({i for i, entries in enumerate(device_traces) if entries})
    used += sorted({s["device"] for s in segments if isinstance(s, dict) and type(s.get("device")) is int} - set(used))
    for i in used:
        if 0 <= i <= _MAX_DEVICE:
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
    return imp.build()


# -- export -------------------------------------------------------------------------

_ALLOC_LIKE = (Action.ALLOC, Action.MAP)
_FREE_LIKE = (Action.FREE, Action.UNMAP)


def device_indices(devices: list[str]) -> list[int]:
    """Snapshot device index of each trace device.

    'cuda:N' keeps index N; other devices (cpu, mps, ...) follow the highest CUDA index.
    """
    indices: list[int | None] = []
    for name in devices:
        kind, _, num = name.partition(":")
        indices.append(int(num) if kind == "cuda" and num.isdigit() and int(num) < _MAX_DEVICE else None)
    nxt = max((i for i in indices if i is not None), default=-1) + 1
    out = []
    for i in indices:
        if i is None or i in out:
            i, nxt = nxt, nxt + 1
        out.append(i)
    return out


def _plain(value: Any, where: str = "segments") -> Any:
    """Deep copy into types every pickle reader (and MemoryViz.js) knows: no numpy, no classes."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, np.integer | np.floating | np.bool_):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v, where) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [_plain(v, where) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    raise TypeError(f"{where}: cannot export a {type(value).__name__} into a snapshot")


def _check_segments(segments: list[dict[str, Any]]) -> None:
    """The invariant torch's ``segsum`` asserts: blocks tile their segment exactly."""
    for i, seg in enumerate(segments):
        covered = sum(int(b["size"]) for b in seg["blocks"])
        if covered != int(seg["total_size"]):
            raise ValueError(f"segments[{i}]: blocks cover {covered} bytes of a {seg['total_size']}-byte segment")


def _segment(device: int, addr: int, nbytes: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "device": device,
        "address": addr,
        "total_size": nbytes,
        "allocated_size": nbytes,
        "active_size": nbytes,
        "requested_size": nbytes,
        "stream": 0,
        "segment_type": "large" if nbytes > 1 << 20 else "small",  # torch's small pool holds blocks <= 1 MiB
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": [
            {"address": addr, "size": nbytes, "requested_size": nbytes, "state": "active_allocated", "frames": frames}
        ],
    }


@dataclass
class _Placement:
    """Where each block sits in the export, and which blocks get a segment of their own.

    The viewer pairs entries by address and looks every block up in a live
    segment, so live blocks must never share an address and every block must
    sit in a segment for its whole life.
    """

    address: dict[int, int]  # tensor -> address
    own_segment: set[int] | None  # tensors wrapped in segment_alloc/segment_free; None = every block


def _block_rows(trace: Trace, rows: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    """(row, action, tensor, device, bytes) of each row, as plain ints."""
    ev = trace.events
    return list(
        zip(rows.tolist(), *(ev[k][rows].tolist() for k in ("action", "tensor", "device", "nbytes")), strict=True)
    )


def _disjoint(blocks: list[tuple[int, int, int, int, int]], address: np.ndarray) -> bool:
    """True if no two blocks live at once overlap, no block is at 0, and each free names its alloc's address."""
    starts: dict[int, list[int]] = {}  # device -> sorted starts of live blocks
    ends: dict[tuple[int, int], int] = {}  # (device, start) -> end
    owner: dict[int, tuple[int, int]] = {}  # tensor -> (device, start)
    for row, action, tensor, device, nbytes in blocks:
        start = int(address[row])
        order = starts.setdefault(device, [])
        if action in _FREE_LIKE:
            if tensor not in owner:
                continue  # freed, never allocated here: it overlaps nothing we know
            if owner.pop(tensor) != (device, start):
                return False
            del ends[(device, start)]
            order.pop(bisect.bisect_left(order, start))
            continue
        end = start + nbytes
        i = bisect.bisect_left(order, start)
        # live blocks are disjoint, so only the neighbours can overlap the new one
        if start == 0 or (i < len(order) and order[i] < end) or (i > 0 and ends[(device, order[i - 1])] > start):
            return False
        order.insert(i, start)
        ends[(device, start)] = end
        owner[tensor] = (device, start)
    return True


def _place(
    trace: Trace,
    blocks: list[tuple[int, int, int, int, int]],
    index_of: list[int],
    segments: list[dict[str, Any]] | None,
    addresses: np.ndarray | None,
) -> _Placement:
    first: dict[int, tuple[int, int, int]] = {}  # tensor -> (row, device index, bytes) of its first row
    freed: set[int] = set()
    for row, action, tensor, device, nbytes in blocks:
        first.setdefault(tensor, (row, index_of[device], nbytes))
        if action in _FREE_LIKE:
            freed.add(tensor)
    if addresses is not None:  # the caller's (an allocator replay's): trusted to match its segments
        return _Placement({t: int(addresses[row]) for t, (row, _, _) in first.items()}, set())
    if segments is None and _disjoint(blocks, trace.events["address"]):
        return _Placement({t: int(trace.events["address"][row]) for t, (row, _, _) in first.items()}, None)

    # Invent addresses: never reused, above every given segment.
    top = max((int(s["address"]) + int(s["total_size"]) for s in segments or []), default=0)
    cursor = max(_SYNTH_BASE_ADDR, -(-top // _SYNTH_SEGMENT_GAP) * _SYNTH_SEGMENT_GAP + _SYNTH_SEGMENT_GAP)
    address: dict[int, int] = {}
    if segments is not None:
        # blocks live at the end take the addresses of the given segments' active blocks (same device and size)
        free_slots: dict[tuple[int, int], list[int]] = {}
        for seg in segments:
            cursor_in_segment = int(seg["address"])
            for block in seg["blocks"]:
                addr = int(block.get("address", cursor_in_segment))
                cursor_in_segment = addr + int(block["size"])
                if block["state"] == "active_allocated":
                    key = (int(seg["device"]), int(block.get("requested_size", block["size"])))
                    free_slots.setdefault(key, []).append(addr)
        for slots in free_slots.values():
            slots.reverse()  # pop() hands out the lowest address first
        for tensor, (_, device, nbytes) in first.items():
            slots = free_slots.get((device, nbytes))
            if tensor not in freed and slots:
                address[tensor] = slots.pop()
    for tensor, (_, _, nbytes) in first.items():
        if tensor not in address:
            address[tensor] = cursor
            cursor += -(-max(nbytes, 1) // _SYNTH_ALIGN) * _SYNTH_ALIGN
    # given segments: blocks freed in the trace need a segment of their own while they live
    return _Placement(address, None if segments is None else freed)


def _export_frames(trace: Trace, rows: np.ndarray) -> list[list[dict[str, Any]]]:
    """Per row, two frames the viewer prints under its block: 'module:0:op' and the attribution.

    One list object per distinct attribution, so pickle memoizes it as torch does.
    """
    ev = trace.events
    file_backed = np.isin(ev["action"][rows], np.array([Action.MAP, Action.UNMAP], dtype=ev["action"].dtype))
    names = ("module", "op", "category", "modality", "phase", "dtype", "shape")
    keys = list(zip(*(ev[k][rows].tolist() for k in names), file_backed.tolist(), strict=True))
    lists: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for key in set(keys):
        module, op, category, modality, phase, dtype, shape, mapped = key
        text = f"category={enum_name(Category(category))} modality={enum_name(Modality(modality))}"
        text += f" phase={enum_name(Phase(phase))}"
        if dtype >= 0:
            text += f" dtype={trace.strings[dtype]}"
        if shape >= 0:
            text += " shape=" + "x".join(str(d) for d in trace.shapes[shape])
        if mapped:
            text += " memory=file"
        lists[key] = [
            {"filename": trace.string(module) or "<no module>", "line": 0, "name": trace.string(op) or "<no op>"},
            {"filename": "memwarden", "line": 0, "name": text},
        ]
    return [lists[key] for key in keys]


def to_snapshot(
    trace: Trace,
    segments: list[dict[str, Any]] | None = None,
    *,
    allocator_settings: dict[str, Any] | None = None,
    addresses: np.ndarray | None = None,
    include_file_backed: bool = True,
) -> dict[str, Any]:
    """A snapshot dict (plain dicts/lists) of ``trace`` that torch's ``_memory_viz`` tools accept.

    ``segments``: the allocator state at the end (snapshot-format segment dicts,
    e.g. ``replay(...).segments_at_end_snapshot``), used as is. Blocks live at
    the end move to the addresses of its active blocks of the same size; the
    others get a segment of their own while they live, so the viewer's history
    stays consistent. Without ``segments`` every block gets its own segment.
    ``addresses``: per-event addresses matching ``segments`` (e.g. from the
    replay), used instead of all of the above.
    The trace's own SEGMENT_* rows are not exported: they describe an allocator
    the exported segments do not come from.
    """
    if addresses is not None and (segments is None or len(addresses) != trace.num_events):
        raise ValueError("addresses needs segments and one entry per event")
    final = None
    if segments is not None:
        final = _plain(list(segments))
        _check_segments(final)
    index_of = device_indices(trace.devices)
    ev = trace.events
    action, nbytes, time_us = ev["action"], ev["nbytes"], ev["time_us"]
    wanted = [Action.ALLOC, Action.FREE, Action.PREEXISTING, Action.OOM]
    if include_file_backed:
        wanted += [Action.MAP, Action.UNMAP]
    rows = np.flatnonzero(
        np.isin(action, np.array(wanted, dtype=action.dtype)) & ((nbytes > 0) | (action == Action.OOM))
    )
    entries = _block_rows(trace, rows)
    blocks = [b for b in entries if b[1] != Action.OOM]
    place = _place(trace, blocks, index_of, final, addresses)
    owns = (lambda tensor: True) if place.own_segment is None else place.own_segment.__contains__

    traces: list[list[dict[str, Any]]] = [[] for _ in range(max(index_of, default=0) + 1)]
    live: dict[int, tuple[int, int, int, list[dict[str, Any]]]] = {}  # tensor -> (device, addr, bytes, frames)
    oom_free = _oom_device_free(trace)
    for (_, a, t, dev, n), ts, frames in zip(entries, time_us[rows].tolist(), _export_frames(trace, rows), strict=True):
        d = index_of[dev]
        if a == Action.OOM:
            free = oom_free.get((trace.devices[dev], ts), 0)
            traces[d].append(
                {"action": "oom", "device_free": free, "size": n, "stream": 0, "time_us": ts, "frames": frames}
            )
        elif a in _ALLOC_LIKE or a == Action.PREEXISTING:
            addr = place.address[t]
            live[t] = (d, addr, n, frames)
            if a == Action.PREEXISTING:
                continue  # alive before the trace: a block in the segments with no alloc entry
            kinds = ("segment_alloc", "alloc") if owns(t) else ("alloc",)
            traces[d].extend(_entry(kind, addr, n, ts, frames) for kind in kinds)
        else:  # a free repeats what its alloc said, on the alloc's device
            d, addr, n, frames = live.pop(t, None) or (d, place.address[t], n, frames)
            kinds = ("free_requested", "free_completed") + (("segment_free",) if owns(t) else ())
            traces[d].extend(_entry(kind, addr, n, ts, frames) for kind in kinds)

    if final is None:
        ends = sorted(live.values(), key=lambda block: (block[0], block[1]))
        final = [_segment(d, addr, n, frames) for d, addr, n, frames in ends]
    settings = dict(_DEFAULT_ALLOCATOR_SETTINGS)
    settings.update(_plain(allocator_settings or {}, "allocator_settings"))
    names = [""] * len(traces)
    for name, i in zip(trace.devices, index_of, strict=True):
        names[i] = name
    return {
        "segments": final,
        "device_traces": traces,
        "allocator_settings": settings,
        EXPORT_MARKER: {
            "format": 1,
            "devices": names,
            "start_us": int(time_us.min()) if len(time_us) else 0,
            "segments": "per-block" if segments is None else "given",
        },
    }


def _entry(action: str, addr: int, size: int, time_us: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time_us, "frames": frames}


def _oom_device_free(trace: Trace) -> dict[tuple[str, int], int]:
    found: dict[tuple[str, int], int] = {}
    for oom in trace.metadata.get("ooms") or []:
        try:
            found[(str(oom["device"]), int(oom["time_us"]))] = int(oom["device_free_bytes"])
        except (KeyError, TypeError, ValueError):
            continue
    return found


def save_snapshot(
    trace: Trace,
    path: str | os.PathLike[str],
    segments: list[dict[str, Any]] | None = None,
    **options: Any,
) -> Path:
    """Pickle ``to_snapshot(trace, segments, **options)`` atomically (protocol 4, plain types only)."""
    data = pickle.dumps(to_snapshot(trace, segments, **options), protocol=PICKLE_PROTOCOL)
    return atomic_write(path, data)
