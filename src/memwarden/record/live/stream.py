"""Streaming a running capture to a file, so that a process killed mid-run leaves its trace.

A ``Streamer`` appends the capture's log to a stream file (``memwarden.trace.stream``) every
``interval_s`` (100 ms) from a background thread and at step and optimizer-step boundaries (at most one per 10 ms);
each chunk is one ``write`` to the kernel, so once ``flush`` returns its data outlives the process
(SIGKILL, SIGABRT, SIGSEGV, ``os._exit``): at most the last interval is lost. What a chunk holds:
the recorder's rows logged since the last chunk (raw, as ``native.stream_since`` returns them),
the op names and shapes first seen since, and what the Python side saw since (modules, tags,
fingerprints, steps, optimizer steps, storages outside the allocator and their releases, the
process's own resident size).

A row is streamed as it is when the chunk is cut: the dtype, shape and written bytes that the op
which made it fills in when it returns are missing for rows cut mid-op (a clean stop replaces
the stream with the complete trace, so only a killed run's trace shows this).

``memwarden.flush()`` (``flush_active``) flushes the running capture's stream now: a script can
make a point durable before something risky, and tests make their crashes deterministic with it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from memwarden.record.attribution.emit_events import DTYPE_NAMES
from memwarden.record.attribution.log import StepRecord, StorageRecord
from memwarden.record.live.rss import sample
from memwarden.trace.stream import encode_chunk, stream_header

if TYPE_CHECKING:
    from memwarden.record.live.running import RunningCapture

__all__ = ["Streamer", "flush_active"]

_BOUNDARY_GAP_NS = 10_000_000  # step/optimizer boundaries flush at most once per 10 ms (see ``boundary``)
# ...and at most so often that boundary flushes take no more than 1/_BUDGET of the run: after a
# flush that took d, the next boundary flush waits max(10 ms, _BUDGET * d), never longer than the
# interval (the loss bound is the interval's either way).
_BUDGET = 100
_LIGHT = frozenset({"step", "optimizer"})  # boundary flushes (see ``_flush_locked``)


def _storage(rec: StorageRecord) -> dict[str, Any]:
    return {
        "ptr": rec.ptr,
        "nbytes": rec.nbytes,
        "dtype": rec.dtype,
        "shape": list(rec.shape),
        "file": rec.file,
        "t_ns": rec.t_ns,
        "freed_ns": rec.freed_ns,
    }


_STEP_FIELDS = tuple(f.name for f in dataclasses.fields(StepRecord))
# A chunk carries its steps as rows (the values in ``STEP_ROW_FIELDS`` order, after the step's
# index), not one JSON object each: a loop of sub-millisecond steps sends hundreds a chunk, and
# building and encoding a dict per step was most of a light flush.
STEP_ROW_FIELDS = (
    "start_ns",
    "ctx",
    "phase",
    "seq_len",
    "end_ns",
    "tokens",
    "batch",
    "input_ids",
    "grad",
    "media_digests",
    "call_site",
)
if STEP_ROW_FIELDS[:-1] != _STEP_FIELDS:  # pragma: no cover - a StepRecord field added without its row slot
    raise ImportError("capture.live.stream: STEP_ROW_FIELDS is out of step with StepRecord")


def _step_row(index: int, step: StepRecord, call_sites: dict[int, str]) -> list[Any]:
    return [
        index,
        step.start_ns,
        step.ctx,
        int(step.phase),
        step.seq_len,
        step.end_ns,
        step.tokens,
        step.batch,
        step.input_ids,
        step.grad,
        step.media_digests,
        call_sites.get(step.start_ns),
    ]


class Streamer:
    """Appends one capture's log to ``path``; ``start`` after the recorder starts, ``close`` before
    it is drained."""

    # The process samples its own PSS and anonymous/file split (``smaps_rollup``, a walk of every
    # mapping: ~5-8 ms in a torch process) on every ``detail_every``-th interval flush (first at 10 s, so a
    # short run does not pay for it; its resident size is sampled at every full flush); 0: never
    # (``memwarden trace``'s child, whose supervisor samples it from outside every 100 ms).
    detail_every = 100

    def __init__(self, capture: RunningCapture, path: str | os.PathLike[str], interval_s: float = 0.1) -> None:
        self.capture = capture
        self.path = os.fspath(path)
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fd = -1
        self._cursor = (0, 0, 0)  # rows, shape-pool entries, op names already streamed
        self._sites_sent = 0  # recorder sites (source lines) already streamed
        self._sent = {"modules": 0, "tags": 0, "fingerprints": 0, "steps": 0, "optimizer": 0, "annotations": 0}
        self._storages: set[str] = set()
        self._freed: set[str] = set()
        self._ticks = 0
        self.flushes = 0
        self._last_ns = 0
        self._gap_ns = _BOUNDARY_GAP_NS
        self.bytes_written = 0

    # -- lifecycle -----------------------------------------------------------------
    def _open(self, path: str) -> None:
        """Start a stream at ``path``: the header and the start chunk (cursors from zero)."""
        cap = self.capture
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o666)
        ops = list(cap._native.stream_since(0, 0, 0)[4])  # op names interned by earlier captures
        self._cursor = (0, 0, len(ops))
        self._sites_sent = 0
        self._sent = dict.fromkeys(self._sent, 0)
        self._storages, self._freed = set(), set()
        names = list(cap._native.scalar_type_names())
        head = {
            "kind": "start",
            "pid": os.getpid(),
            "t0_ns": cap._t0,
            "wall0": cap._wall0,
            "metadata": dict(cap.metadata),
            "dtype_names": names,
            "dtype_torch_names": [DTYPE_NAMES.get(n, n) for n in names],
            "ops": ops,
            "interval_s": self.interval_s,
        }
        # Where this stream's rows meet the crash ring's numbers (native ring_origin; recover_ring):
        # read with the cursors at zero, so the stream's row k >= split is ring row base + k - split.
        origin = getattr(cap._native, "ring_origin", None)
        ring = origin() if origin is not None else None
        if ring is not None:
            head["ring"] = [int(v) for v in ring]
        self._write(stream_header() + encode_chunk(head))

    def start(self) -> None:
        self._open(self.path)
        self.flush("start")
        self._thread = threading.Thread(target=self._run, name="memwarden-stream", daemon=True)
        self._thread.start()
        _STREAMERS.append(self)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush("interval")
            except Exception:  # a full disk must not kill the traced program
                return

    def close(self) -> None:
        """Stop the thread and write what is left (the caller drains the recorder after)."""
        self._stop.set()
        if self in _STREAMERS:
            _STREAMERS.remove(self)
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._fd >= 0:
            self.flush("stop")
            self._write(encode_chunk({"kind": "end", "t_ns": time.monotonic_ns()}))
            os.close(self._fd)
            self._fd = -1

    def rebase(self, compact: Any) -> None:
        """The flight recorder's cut: run ``compact`` (which drops the log's past) and rewrite the
        stream as it now stands, atomically (a new file renamed over the old), so the stream's
        size is bounded like the log and a kill at any moment leaves a whole stream."""
        with self._lock:
            if self._fd < 0:
                return
            compact()
            os.close(self._fd)
            tmp = self.path + ".rebase"
            self._open(tmp)
            self._flush_locked("rebase")
            os.replace(tmp, self.path)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self.bytes_written += len(data)

    # -- chunks --------------------------------------------------------------------
    def boundary(self, reason: str) -> None:
        """A step or optimizer step ended: flush, unless a flush ran within the gap (10 ms, or 100
        times what the last flush took, at most the interval): a decode loop of sub-millisecond
        steps would otherwise spend more time flushing than computing."""
        if time.monotonic_ns() - self._last_ns >= self._gap_ns:
            self.flush(reason)

    def flush(self, reason: str = "flush") -> None:
        """Append everything logged since the last chunk; durable against the process's death
        when this returns."""
        with self._lock:
            if self._fd < 0:
                return
            self._flush_locked(reason)

    def _flush_locked(self, reason: str) -> None:
        began_ns = time.monotonic_ns()
        cap = self.capture
        rows, n_rows, dims, n_dims, ops = cap._native.stream_since(*self._cursor)
        self._cursor = (n_rows, n_dims, self._cursor[2] + len(ops))
        sites = cap._native.site_names_since(self._sites_sent)  # after the rows: covers them
        self._sites_sent += len(sites)
        head: dict[str, Any] = {
            "kind": "events",
            "reason": reason,
            "t_ns": time.monotonic_ns(),
            "ops": ops,
            "sites": sites,
        }
        # A step boundary flushes light: the rows and what the hooks logged since. Storages outside
        # the allocator (a scan of every one), annotations and the resident sample wait for the next
        # full flush (every interval, at most 100 ms away), so a decode loop of sub-millisecond steps
        # pays for what changed, not for what the process holds.
        full = reason not in _LIGHT
        self._python_side(head, full)
        if full:
            self._ticks += reason == "interval"
            every = self.detail_every
            res = sample("self", detail=every > 0 and reason == "interval" and self._ticks % every == 0)
            if res is not None:
                head["resident"] = [res]
        columns: list[tuple[str, np.ndarray]] = [
            ("events", np.frombuffer(rows, dtype=np.uint8)),
            ("shapes", np.frombuffer(dims, np.int64)),
        ]
        self._write(encode_chunk(head, columns))
        self.flushes += 1
        self._last_ns = time.monotonic_ns()
        if reason in _LIGHT:
            self._gap_ns = min(max(_BOUNDARY_GAP_NS, _BUDGET * (self._last_ns - began_ns)), int(self.interval_s * 1e9))

    def _delta(self, name: str, items: list[Any]) -> list[Any]:
        """What ``items`` gained since the last chunk: one slice, never a copy of the whole list
        (the lists only grow between two flushes; the ring's cut resets the cursors)."""
        start = self._sent[name]
        new = items[start:]
        self._sent[name] = start + len(new)
        return new

    def _python_side(self, head: dict[str, Any], full: bool = True) -> None:
        cap = self.capture
        log = cap._log
        head["modules"] = [[m.path, m.label, m.modality] for m in self._delta("modules", cap._modules)]
        head["tags"] = [list(t) for t in self._delta("tags", log.tags)]
        head["fingerprints"] = self._delta("fingerprints", log.fingerprints)
        # Steps and optimizer spans change until they end: resend from the first one still open.
        first = self._sent["steps"]
        steps = log.steps[first:]
        if steps:
            head["step_fields"] = STEP_ROW_FIELDS
            head["step_rows"] = [_step_row(i, s, cap._call_sites) for i, s in enumerate(steps, first)]
        for s in steps:
            if s.end_ns is None:
                break
            first += 1
        self._sent["steps"] = first
        first = self._sent["optimizer"]
        spans = [list(s) for s in log.optimizer_spans[first:]]
        head["optimizer"] = [[i, s] for i, s in enumerate(spans, first)]
        for span in spans:
            if span[1] < 0:
                break
            first += 1
        self._sent["optimizer"] = first
        if not full:
            return
        storages, freed = [], []
        for prefix, table in (("pre", log.preexisting_storages), ("map", log.mapped_storages)):
            for ptr, rec in list(table.items()):
                key = f"{prefix}:{ptr}"
                if key not in self._storages:
                    self._storages.add(key)
                    storages.append([key, _storage(rec)])
                elif rec.freed_ns is not None and key not in self._freed:
                    self._freed.add(key)
                    freed.append([key, rec.freed_ns])
        head["storages"], head["freed"] = storages, freed
        head["annotations"] = self._delta("annotations", list(cap.metadata.get("annotations", ())))


_STREAMERS: list[Streamer] = []  # streams of running captures


def flush_active() -> bool:
    """Flush the stream of every running capture that streams; False if none does."""
    streamers = list(_STREAMERS)
    for s in streamers:
        s.flush("user")
    return bool(streamers)
