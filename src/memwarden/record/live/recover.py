"""A stream's chunks back into a fully attributed Trace: the capture's own attribution
(``Attributor``) run on the rows and observations the stream holds, as ``Capture.stop`` would
have run it on the process's memory. The supervisor of ``memwarden trace`` calls this when the
traced process died before it could stop its capture.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.record.attribution.attributor import Attributor
from memwarden.record.attribution.log import CaptureLog, StepRecord, StorageRecord
from memwarden.record.live.sites import apply_call_sites
from memwarden.record.modality import ModalityRules
from memwarden.trace.model import Phase, Trace
from memwarden.trace.stream import RAW_EVENT_DTYPE, StreamLog

__all__ = ["RingRecovery", "attribute_stream", "recover_ring"]


def _storage(rec: dict[str, Any]) -> StorageRecord:
    freed = rec.get("freed_ns")
    return StorageRecord(
        ptr=int(rec["ptr"]),
        nbytes=int(rec["nbytes"]),
        dtype=str(rec.get("dtype") or ""),
        shape=tuple(int(d) for d in rec.get("shape", ())),
        file=rec.get("file"),
        t_ns=int(rec.get("t_ns", 0)),
        freed_ns=None if freed is None else int(freed),
    )


def _step(rec: dict[str, Any], end_ns: int) -> StepRecord:
    end = rec.get("end_ns")
    return StepRecord(
        start_ns=int(rec["start_ns"]),
        ctx=int(rec["ctx"]),
        phase=Phase(int(rec["phase"])),
        seq_len=rec.get("seq_len"),
        end_ns=end_ns if end is None else int(end),
        tokens=dict(rec.get("tokens") or {}),
        batch=rec.get("batch"),
        input_ids=tuple(rec.get("input_ids") or ()),
        grad=rec.get("grad"),
        media_digests=tuple(str(x) for x in rec.get("media_digests") or ()),
    )


def attribute_stream(log: StreamLog, metadata: dict[str, Any] | None = None) -> Trace:
    """The Trace the capture would have built at its stop, from what reached the stream."""
    raw = log.raw_rows()
    end_ns = max([log.last_t_ns, log.t0_ns] + ([int(raw["t_ns"].max())] if len(raw) else []))
    capture_log = CaptureLog()
    capture_log.tags = [(int(t), int(p), str(k), str(m)) for t, p, k, m in log.tags]
    capture_log.fingerprints = list(log.fingerprints)
    capture_log.steps = [_step(log.steps[i], end_ns) for i in sorted(log.steps)]
    capture_log.optimizer_spans = [
        [s, e if e >= 0 else end_ns] for s, e in (log.optimizer[i] for i in sorted(log.optimizer))
    ]
    for key, rec in log.storages.items():
        table = capture_log.mapped_storages if key.startswith("map:") else capture_log.preexisting_storages
        table[int(rec["ptr"])] = _storage(rec)
    # ops interned before this capture started are in the start chunk; row indices count from 0
    drained = {
        "time_ns": raw["t_ns"].copy(),
        "ptr": raw["ptr"].copy(),
        "nbytes": raw["nbytes"].copy(),
        "id": raw["id"].copy(),
        "ctx": raw["ctx"].copy(),
        "op_outer": raw["op_outer"].copy(),
        "op_inner": raw["op_inner"].copy(),
        "shape_off": raw["shape_off"].copy(),
        "ndim": raw["ndim"].copy(),
        "dtype": raw["dtype"].copy(),
        "action": raw["action"].copy(),
        "written": raw["written"].copy(),
        "shapes": np.asarray(log.shape_pool, dtype=np.int64),
        "op_names": list(log.op_names),
        "site": raw["site"].copy(),
        "site_names": list(log.site_names),
        "untracked_frees": 0,
        "unwrapped_allocations": 0,
    }
    meta = {**log.start.get("metadata", {}), **(metadata or {})}
    if log.annotations:
        meta["annotations"] = list(log.annotations)
    attributor = Attributor(
        log=capture_log,
        modules=[(str(m[0]), str(m[1]), int(m[2])) for m in log.modules],
        dtype_names=[str(n) for n in log.start.get("dtype_names", ())],
        t0_ns=log.t0_ns,
        end_ns=end_ns,
        metadata=meta,
        rules=ModalityRules(),
    )
    trace = attributor.build(drained)
    call_sites = {int(s["start_ns"]): str(s["call_site"]) for s in log.steps.values() if s.get("call_site")}
    apply_call_sites(trace.metadata.get("steps", []), call_sites, log.t0_ns)
    trace.metadata["recovered"] = log.recovery_note()
    return trace


# -- the crash ring (native.cpp's ring_attach) ----------------------------------------------
RING_MAGIC = b"MWRING01"
RING_HEADER_BYTES = 4096
# magic, version, row bytes, capacity, side capacity, written, side used, side records dropped
_RING_HEAD = struct.Struct("<8sIIQQQQQ")
_SIDE_HEAD = struct.Struct("<B3xiI")  # kind, id (or shape-pool offset), payload bytes
_SIDE_OP, _SIDE_SITE, _SIDE_SHAPE = 1, 2, 3


@dataclass(frozen=True)
class RingRecovery:
    """What the crash ring added to a stream: rows the stream did not reach, and rows neither holds."""

    recovered_rows: int
    lost_events: int
    side_records_dropped: int

    def note(self) -> dict[str, int]:
        return {
            "ring_rows": self.recovered_rows,
            "lost_events": self.lost_events,
            "ring_side_dropped": self.side_records_dropped,
        }


def _side_records(side: memoryview) -> list[tuple[int, int, bytes]]:
    out, pos = [], 0
    while pos + _SIDE_HEAD.size <= len(side):
        kind, ident, nbytes = _SIDE_HEAD.unpack_from(side, pos)
        end = pos + _SIDE_HEAD.size + nbytes
        if end > len(side):
            break
        out.append((int(kind), int(ident), bytes(side[pos + _SIDE_HEAD.size : end])))
        pos = end
    return out


def _extend_names(names: list[str], records: list[tuple[int, int, bytes]], kind: int) -> None:
    """Names are interned with consecutive ids: append those past the stream's, in id order."""
    for _, ident, text in sorted((r for r in records if r[0] == kind), key=lambda r: r[1]):
        if ident == len(names):
            names.append(text.decode("utf-8", "replace"))


def recover_ring(log: StreamLog, path: str | os.PathLike[str]) -> RingRecovery | None:
    """Append to ``log`` the rows the crash ring at ``path`` holds past the stream's last chunk,
    with the op names, sites and shapes they refer to; None if there is no readable ring.

    The stream's start chunk says where its rows meet the ring's sequence numbers (``ring``:
    split, base): its row ``k >= split`` is ring row ``base + k - split``, so the first row the
    stream lacks is ``base + len(rows) - split``. Ring rows from there on are taken while their
    slot still holds them; the rest (overwritten by a full ring, or cut mid-copy) are lost."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    origin = log.start.get("ring")
    if len(data) < RING_HEADER_BYTES or not origin:
        return None
    magic, version, row_bytes, capacity, side_cap, written, side_used, dropped = _RING_HEAD.unpack_from(data)
    rows_at = RING_HEADER_BYTES + 8 * capacity
    side_at = rows_at + row_bytes * capacity
    if magic != RING_MAGIC or version != 1 or row_bytes != RAW_EVENT_DTYPE.itemsize or side_at + side_cap > len(data):
        return None
    split, base = int(origin[0]), int(origin[1])
    have = sum(len(r) for r in log.rows)
    first = base + max(0, have - split)
    if written <= first:
        return RingRecovery(0, 0, int(dropped))
    seqs = np.frombuffer(data, dtype="<u8", count=capacity, offset=RING_HEADER_BYTES)
    rows = np.frombuffer(data, dtype=RAW_EVENT_DTYPE, count=capacity, offset=rows_at)
    want = np.arange(max(first, written - capacity), written, dtype=np.uint64)
    slots = want % np.uint64(capacity)
    whole = seqs[slots] == want
    got = rows[slots[whole]].copy()
    records = _side_records(memoryview(data)[side_at : side_at + min(side_used, side_cap)])
    _extend_names(log.op_names, records, _SIDE_OP)
    _extend_names(log.site_names, records, _SIDE_SITE)
    for _, offset, dims in sorted((r for r in records if r[0] == _SIDE_SHAPE), key=lambda r: r[1]):
        if offset == len(log.shape_pool):
            log.shape_pool.extend(np.frombuffer(dims, dtype="<i8").tolist())
    kept = _sanitize(got, log)
    if len(kept):
        log.rows.append(kept)
        log.last_t_ns = max(log.last_t_ns, int(kept["t_ns"].max()))
    # Module markers of modules the stream never named are dropped, not lost: they hold no memory.
    return RingRecovery(int(len(got)), int(written - first - len(got)), int(dropped))


def _sanitize(rows: np.ndarray, log: StreamLog) -> np.ndarray:
    """Ring rows may name what the stream never got (a module registered, an op, a site or a shape
    interned after the last chunk, a side record dropped): make those references unknown."""
    n_modules = len(log.modules)
    rows["op_outer"][rows["op_outer"] >= len(log.op_names)] = -1
    rows["op_inner"][rows["op_inner"] >= len(log.op_names)] = -1
    rows["site"][rows["site"] >= len(log.site_names)] = -1
    bad_shape = rows["shape_off"].astype(np.int64) + rows["ndim"] > len(log.shape_pool)
    rows["shape_off"][bad_shape] = -1
    rows["ndim"][bad_shape] = 0
    rows["ctx"][rows["ctx"] >= n_modules] = -1
    markers = rows["action"] >= 2  # ENTER/EXIT: the row's id is a module context
    return rows[~(markers & (rows["id"] >= n_modules))]
