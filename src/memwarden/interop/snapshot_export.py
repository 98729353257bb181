"""A Trace as a PyTorch memory snapshot dict, for PyTorch's own viewer and tools.

``to_snapshot`` writes a dict that PyTorch's own tools accept:
``python -m torch.cuda._memory_viz stats|trace|trace_plot|segment_plot``.
Their JavaScript viewer (torch/utils/viz/MemoryViz.js) reads pickle protocol
2-4 only, pairs blocks by address, and looks every live block up in a live
segment, so the export keeps addresses disjoint while live and, unless the
caller passes allocator segments, gives each block its own segment.
``memwarden.interop.snapshot.save_snapshot`` pickles the dict;
``memwarden.interop.snapshot_import`` reads it back, attribution included.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import numpy as np

from memwarden.interop.snapshot_import import EXPORT_MARKER, MAX_DEVICE  # the device cap and marker the reader checks
from memwarden.trace.model import Action, Category, Modality, Phase, Trace, enum_name
from memwarden.trace.sites import parse_line

__all__ = ["device_indices", "to_snapshot"]

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

_ALLOC_LIKE = (Action.ALLOC, Action.MAP)
_FREE_LIKE = (Action.FREE, Action.UNMAP)


def device_indices(devices: list[str]) -> list[int]:
    """Snapshot device index of each trace device.

    'cuda:N' keeps index N; other devices (cpu, mps, ...) follow the highest CUDA index.
    """
    indices: list[int | None] = []
    for name in devices:
        kind, _, num = name.partition(":")
        indices.append(int(num) if kind == "cuda" and num.isdigit() and int(num) < MAX_DEVICE else None)
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
            found = free_slots.get((device, nbytes))
            if tensor not in freed and found:
                address[tensor] = found.pop()
    for tensor, (_, _, nbytes) in first.items():
        if tensor not in address:
            address[tensor] = cursor
            cursor += -(-max(nbytes, 1) // _SYNTH_ALIGN) * _SYNTH_ALIGN
    # given segments: blocks freed in the trace need a segment of their own while they live
    return _Placement(address, None if segments is None else freed)


def _python_frame(text: str) -> dict[str, Any]:
    src = parse_line(text)
    return {"filename": src.file, "line": src.line, "name": src.function}


def _export_frames(trace: Trace, rows: np.ndarray) -> list[list[dict[str, Any]]]:
    """Per row, the frames the viewer prints under its block: the Python stack (or the user's line)
    the block was allocated from, innermost first as torch records them, then 'module:0:op' and the
    attribution.

    One list object per distinct attribution, so pickle memoizes it as torch does.
    """
    ev = trace.events
    file_backed = np.isin(ev["action"][rows], np.array([Action.MAP, Action.UNMAP], dtype=ev["action"].dtype))
    names = ("module", "op", "category", "modality", "phase", "dtype", "shape", "line", "stack")
    keys = list(zip(*(ev[k][rows].tolist() for k in names), file_backed.tolist(), strict=True))
    lists: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for key in set(keys):
        module, op, category, modality, phase, dtype, shape, line, stack, mapped = key
        text = f"category={enum_name(Category(category))} modality={enum_name(Modality(modality))}"
        text += f" phase={enum_name(Phase(phase))}"
        if dtype >= 0:
            text += f" dtype={trace.strings[dtype]}"
        if shape >= 0:
            text += " shape=" + "x".join(str(d) for d in trace.shapes[shape])
        if mapped:
            text += " memory=file"
        python = trace.strings[stack].split("\n") if stack >= 0 else [trace.strings[line]] if line >= 0 else []
        lists[key] = [
            *(_python_frame(f) for f in python),
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
            kinds: tuple[str, ...] = ("segment_alloc", "alloc") if owns(t) else ("alloc",)
            traces[d].extend(_entry(kind, addr, n, ts, frames) for kind in kinds)
        else:  # a free repeats what its alloc said, on the alloc's device
            held = live.pop(t, None)
            d, addr, n, frames = held or (d, place.address[t], n, frames)
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
