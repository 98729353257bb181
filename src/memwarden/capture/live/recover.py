"""A stream's chunks back into a fully attributed Trace: the capture's own attribution
(``Attributor``) run on the rows and observations the stream holds, as ``Capture.stop`` would
have run it on the process's memory. The supervisor of ``memwarden trace`` calls this when the
traced process died before it could stop its capture.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memwarden.capture.attribution.attributor import Attributor
from memwarden.capture.attribution.log import CaptureLog, StepRecord, StorageRecord
from memwarden.capture.live.sites import apply_call_sites
from memwarden.capture.modality import ModalityRules
from memwarden.trace.model import Phase, Trace
from memwarden.trace.stream import StreamLog

__all__ = ["attribute_stream"]


def _storage(rec: dict[str, Any]) -> StorageRecord:
    freed = rec.get("freed_ns")
    return StorageRecord(ptr=int(rec["ptr"]), nbytes=int(rec["nbytes"]), dtype=str(rec.get("dtype") or ""),
                         shape=tuple(int(d) for d in rec.get("shape", ())), file=rec.get("file"),
                         t_ns=int(rec.get("t_ns", 0)), freed_ns=None if freed is None else int(freed))  # fmt: skip


def _step(rec: dict[str, Any], end_ns: int) -> StepRecord:
    end = rec.get("end_ns")
    return StepRecord(start_ns=int(rec["start_ns"]), ctx=int(rec["ctx"]), phase=Phase(int(rec["phase"])),
                      seq_len=rec.get("seq_len"), end_ns=end_ns if end is None else int(end),
                      tokens=dict(rec.get("tokens") or {}), batch=rec.get("batch"),
                      input_ids=tuple(rec.get("input_ids") or ()), grad=rec.get("grad"))  # fmt: skip


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
        "time_ns": raw["t_ns"].copy(), "ptr": raw["ptr"].copy(), "nbytes": raw["nbytes"].copy(),
        "id": raw["id"].copy(), "ctx": raw["ctx"].copy(), "op_outer": raw["op_outer"].copy(),
        "op_inner": raw["op_inner"].copy(), "shape_off": raw["shape_off"].copy(), "ndim": raw["ndim"].copy(),
        "dtype": raw["dtype"].copy(), "action": raw["action"].copy(), "written": raw["written"].copy(),
        "shapes": np.asarray(log.shape_pool, dtype=np.int64), "op_names": list(log.op_names),
        "site": raw["site"].copy(), "site_names": list(log.site_names),
        "untracked_frees": 0, "unwrapped_allocations": 0,
    }  # fmt: skip
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
