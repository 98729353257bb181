"""The flight recorder: ``capture(ring_s=SECONDS)`` / ``memwarden trace --ring SECONDS``.

A service runs for days; a full trace of it is not an option, and when it fails the last seconds
are what matter. In ring mode the capture keeps, however long the process runs:

- the *state at the start of the window*: the allocation rows of every block still alive (weights
  loaded hours ago still count), the tags that say what they are, storages outside the allocator;
- *every event in the window*: the last ``ring_s`` seconds (up to 1.5 x ``ring_s`` while it runs:
  the log is cut every ``ring_s / 2``, and once more to exactly ``ring_s`` when the capture stops).

The window's start is the trace's time zero: the state at the start is a snapshot there (every
block still alive, with the category, modality, phase and line its allocation had), the events
after it keep their times, and the trace's duration is the window (``metadata.ring``'s
``window_start_us`` says where it began in the run).

Memory bound: the recorder's log holds the rows of the last 1.5 windows plus one row per live
block (64 bytes a row), and the Python side the steps, tags and fingerprints of the same span.
The stream file is rewritten at every cut (the window's state, then appended chunks), so the disk
it takes is bounded the same way, and a process killed at any moment leaves its last window.

The window is also written, as a complete ``.mwtrace`` beside the stream
(``<stem>.<reason>-<n>.mwtrace``) without stopping the capture: on SIGUSR1 and when the
process's resident size first crosses ``ring_rss_bytes`` (re-armed below 90% of it), and when a
``GovernedSession`` refuses a request (``dump_on_refusal``, on the refusing thread, before the
``AdmissionError`` is raised; once per cut, so a storm of refusals writes one window, not one
each). A ``MemoryError`` or ``torch.OutOfMemoryError`` that ends the capture writes it as the trace.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memwarden.record.attribution.log import SAVED
from memwarden.record.live.rss import sample

if TYPE_CHECKING:
    from memwarden.record.attribution.log import CaptureLog
    from memwarden.record.live.running import RunningCapture

__all__ = ["FlightRecorder", "dump_on_refusal", "prune_log"]

_TICK_S = 0.1  # resident checks; cuts happen every ring_s / 2


def prune_log(log: CaptureLog, cutoff_ns: int, enters_dropped: int) -> None:
    """Forget what the Python side saw before ``cutoff_ns`` but what still describes live state.

    Each list is replaced by one slice assignment over the part that existed when pruning began,
    so entries the traced thread appends meanwhile are kept (one C-level call under the GIL)."""
    n = len(log.tags)
    # The last tag of each storage: weights stay tagged (a later ``saved`` tag, autograd's, is
    # kept beside its kind, not in its place).
    latest: dict[tuple[int, bool], tuple[int, int, str, str]] = {}
    old = log.tags[:n]
    for t in old:
        if t[0] < cutoff_ns:
            latest[t[1], t[2] == SAVED] = t
    log.tags[:n] = sorted(latest.values()) + [t for t in old if t[0] >= cutoff_ns]
    del log.fingerprints[:enters_dropped]
    n = len(log.steps)
    log.steps[:n] = [s for s in log.steps[:n] if s.end_ns is None or s.end_ns >= cutoff_ns]
    n = len(log.optimizer_spans)
    log.optimizer_spans[:n] = [s for s in log.optimizer_spans[:n] if s[1] < 0 or s[1] >= cutoff_ns]
    for table in (log.preexisting_storages, log.mapped_storages):
        for ptr, rec in list(table.items()):
            if rec.freed_ns is not None and rec.freed_ns < cutoff_ns:
                table.pop(ptr, None)


def _start_window(cap: RunningCapture, cutoff_ns: int) -> None:
    """Make the window's start the capture's time zero: the trace (and the stream's start chunk)
    count from it, so what is alive from before (weights loaded long ago) reads as the state at
    time 0 (the attribution clamps earlier times to 0, as it does for pre-existing tensors) and
    the trace's duration is the window's. Annotations move with the origin; older ones go."""
    shift_ns = cutoff_ns - cap._t0
    if shift_ns <= 0:
        return
    cap._t0 = cutoff_ns
    cap._wall0 += shift_ns / 1e9
    shift_us = shift_ns // 1000
    notes = cap.metadata.get("annotations")
    if notes:
        cap.metadata["annotations"] = [
            {**a, "time_us": int(a["time_us"]) - shift_us} for a in notes if int(a.get("time_us", 0)) >= shift_us
        ]


class FlightRecorder:
    """Keeps one capture's log to its window, and writes the window when asked."""

    def __init__(self, capture: RunningCapture, ring_s: float, rss_bytes: int | None = None) -> None:
        if ring_s <= 0:
            raise ValueError(f"ring_s must be positive (got {ring_s})")
        self.capture = capture
        self.ring_s = float(ring_s)
        self.rss_bytes = rss_bytes
        self.cuts = 0
        self.dropped_rows = 0
        self.dumps: list[str] = []
        self.max_log_bytes = 0
        self.window_start_ns = 0
        self._armed = True
        self._usr1 = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_usr1: Any = None
        self._refusal_armed = True  # re-armed at each cut
        self._dump_lock = threading.Lock()  # the recorder's thread and a refusing thread may both write
        self._origin_ns = 0

    def start(self) -> None:
        self.window_start_ns = self.capture._t0
        self._origin_ns = self.capture._t0  # the capture's own start (its t0 moves with the window)
        self._thread = threading.Thread(target=self._run, name="memwarden-ring", daemon=True)
        self._thread.start()
        _RECORDERS.append(self)
        if threading.current_thread() is threading.main_thread():
            self._previous_usr1 = signal.signal(signal.SIGUSR1, self._on_usr1)

    def close(self) -> None:
        """Stop the recorder; the log is cut to exactly the last ``ring_s`` seconds (the trace the
        capture then builds spans the window, not up to 1.5 of it)."""
        if self in _RECORDERS:
            _RECORDERS.remove(self)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self.cut()
        if self._previous_usr1 is not None:
            signal.signal(signal.SIGUSR1, self._previous_usr1)
            self._previous_usr1 = None

    def stats(self) -> dict[str, Any]:
        """What ``memwarden.ring_stats()`` and ``metadata.ring`` say."""
        native = self.capture._native
        return {
            "window_s": self.ring_s,
            "cuts": self.cuts,
            "dropped_rows": self.dropped_rows,
            "log_bytes": int(native.log_bytes()),
            "max_log_bytes": self.max_log_bytes,
            "window_start_us": max(0, (self.window_start_ns - self._origin_ns) // 1000),
            "rss_threshold_bytes": self.rss_bytes,
            "dumps": list(self.dumps),
        }

    # -- the background thread -------------------------------------------------------
    def _run(self) -> None:
        next_cut = time.monotonic() + self.ring_s / 2
        while not self._stop.wait(_TICK_S):
            try:
                self.max_log_bytes = max(self.max_log_bytes, int(self.capture._native.log_bytes()))
                if self._usr1:
                    self._usr1 = False
                    self.dump("sigusr1")
                if self.rss_bytes is not None:
                    self._check_rss()
                if time.monotonic() >= next_cut:
                    self.cut()
                    next_cut = time.monotonic() + self.ring_s / 2
            except Exception:  # the recorder must never kill the traced program
                continue

    def _check_rss(self) -> None:
        got = sample("self", detail=False)
        rss = int(got["rss"]) if got else 0
        assert self.rss_bytes is not None
        if self._armed and rss >= self.rss_bytes:
            self._armed = False
            self.dump("rss")
        elif rss < 0.9 * self.rss_bytes:
            self._armed = True

    def cut(self) -> None:
        """Forget everything before the window but the live state; rewrite the stream to match."""
        cap = self.capture
        cutoff = int(cap._native.now_ns()) - int(self.ring_s * 1e9)
        if cutoff <= self.window_start_ns:
            return

        def compact() -> None:
            dropped, enters = cap._native.compact(cutoff)
            cap._fp_base += int(enters)
            prune_log(cap._log, cutoff, int(enters))
            _start_window(cap, cutoff)
            kept = {s.start_ns for s in cap._log.steps}
            for start_ns in [k for k in list(cap._call_sites) if k not in kept]:  # steps the cut dropped
                cap._call_sites.pop(start_ns, None)
            self.dropped_rows += int(dropped)

        if cap._streamer is not None:
            cap._streamer.rebase(compact)
        else:
            compact()
        self.window_start_ns = cutoff
        self.cuts += 1
        self._refusal_armed = True
        cap.metadata["ring"] = self.stats()

    # -- writing the window ----------------------------------------------------------
    def _on_usr1(self, signum: int, frame: Any) -> None:
        # Only a flag: the handler runs between two bytecodes of the traced thread, perhaps inside a
        # flush that holds the stream's lock; the recorder's thread writes the window (<= 100 ms).
        self._usr1 = True

    def dump(self, reason: str, detail: str | None = None) -> str | None:
        """Write the window so far as a complete trace beside the stream; returns its path.
        ``detail`` (a refusal's reason) goes into ``metadata.ring.detail``."""
        from memwarden.record.live.recover import attribute_stream
        from memwarden.trace.io import save
        from memwarden.trace.stream import read_stream

        cap = self.capture
        if cap._streamer is None:
            return None
        with self._dump_lock:
            cap._streamer.flush(reason)
            path = Path(cap._streamer.path)
            trace = attribute_stream(read_stream(path.read_bytes()))
            trace.metadata["ring"] = {**self.stats(), "written_for": reason}
            if detail is not None:
                trace.metadata["ring"]["detail"] = detail
            trace.metadata.pop("recovered", None)
            out = path.with_name(f"{path.stem}.{reason}-{len(self.dumps) + 1}.mwtrace")
            save(trace, out)
            self.dumps.append(str(out))
        return os.fspath(out)

    def refused(self, reason: str) -> str | None:
        """A request was refused: write the window, unless a refusal already did since the last cut."""
        if not self._refusal_armed:
            return None
        self._refusal_armed = False
        return self.dump("refusal", reason)


_RECORDERS: list[FlightRecorder] = []  # flight recorders of running captures


def dump_on_refusal(reason: str) -> list[str]:
    """The hook a ``GovernedSession`` calls when it refuses a request (before raising its
    ``AdmissionError``): every running flight recorder writes its window, ``metadata.ring``
    saying ``"written_for": "refusal"`` and the refusal's reason. Returns the paths written; a
    recorder that cannot write (a full disk) is skipped, never failing the caller."""
    written = []
    for recorder in list(_RECORDERS):
        try:
            path = recorder.refused(reason)
        except Exception:  # the refusal itself must reach the caller
            continue
        if path is not None:
            written.append(path)
    return written
