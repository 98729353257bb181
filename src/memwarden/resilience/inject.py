"""Fault injection: real memory limits, allocation jitter, budget squeezes, simulated telemetry.

Everything here is what a phone or a Jetson does to a model server, reproduced in one
process so that a campaign can count what breaks:

- a **memory limit**: ``RLIMIT_AS`` (address space) set in the child before it imports
  anything heavy, so the kernel refuses mappings past it and the workload sees a real
  ``MemoryError`` / allocator failure; on CUDA ``torch.cuda.set_per_process_memory_fraction``.
  An optional RSS watchdog (parent side, see ``campaign``) kills the child with SIGKILL when
  its resident set passes a bound, as Android's lmkd or iOS jetsam do.
- **jitter**: a thread in the child that maps a chunk, touches every page (untouched
  anonymous pages cost nothing and would not count), holds it, unmaps it, at a period,
  as other apps on the device do.
- **squeezes**: at a time on a schedule the limit (and the serving budget) drops to a
  fraction or a byte quantity, and optionally comes back after a while.
- **telemetry**: temperature / power / frame-rate samples ramping between two values,
  fed to a callback (the governed session's budget controller).

Specs are strings (``jitter:size=128MiB,period=15ms``) so that a campaign can pass them to
a child process unchanged; ``parse_inject`` is the one parser and raises one ``InputError``.
The child-side pieces (``Jitter.start``, ``Schedule``) import only the standard library: a
script workload pays nothing for them under a tight limit.
"""

from __future__ import annotations

import ctypes
import mmap
import re
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memwarden.errors import InputError
from memwarden.units import parse_bytes

__all__ = [
    "GRAMMAR",
    "Injection",
    "Jitter",
    "Schedule",
    "Squeeze",
    "Telemetry",
    "TelemetrySample",
    "apply_address_space_limit",
    "is_oom_error",
    "parse_duration_s",
    "parse_inject",
]

PAGE_BYTES = mmap.PAGESIZE
GRAMMAR = (
    "jitter:size=128MiB,period=15ms[,hold=5ms] | squeeze:at=2s,to=60%[,for=1s] (to: a % of the limit "
    "or a byte quantity) | telemetry:period=100ms[,temp=40..85][,power=6..3][,fps=30..15][,over=10s]"
)
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(us|ms|s|min)?\s*$")
_DURATION_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, None: 1.0}
_MAX_DURATION_S = 7 * 24 * 3600.0  # a week: anything longer is a typo, not a schedule


def parse_duration_s(text: str) -> float:
    """'15ms' -> 0.015; a bare number is seconds. ValueError otherwise."""
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"not a duration: {text!r} (examples: 15ms, 2s, 1.5s, 500us)")
    seconds = float(match.group(1)) * _DURATION_S[match.group(2)]
    if seconds > _MAX_DURATION_S:
        raise ValueError(f"duration out of range: {text!r}")
    return seconds


def _range(text: str) -> tuple[float, float]:
    """'40..85' -> (40.0, 85.0); '60' -> (60.0, 60.0)."""
    lo, sep, hi = text.partition("..")
    start = float(lo)
    end = float(hi) if sep else start
    if not (abs(start) < 1e9 and abs(end) < 1e9):  # also refuses nan/inf
        raise ValueError(f"not a finite range: {text!r}")
    return start, end


# -- specs ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Jitter:
    """Map ``size_bytes``, touch each page, hold ``hold_s``, unmap; one cycle per ``period_s``.

    A cycle takes at least as long as touching the pages (page faults: ~0.1 s per 128 MiB on
    a busy laptop core), so a period shorter than that means cycles back to back.
    """

    size_bytes: int
    period_s: float
    hold_s: float

    def spec(self) -> str:
        return f"jitter:size={self.size_bytes},period={self.period_s}s,hold={self.hold_s}s"

    def start(self) -> JitterThread:
        thread = JitterThread(self)
        thread.start()
        return thread


@dataclass(frozen=True, kw_only=True)
class Squeeze:
    """At ``at_s`` the limit drops to ``to_fraction`` of itself (or to ``to_bytes``); back after ``for_s``."""

    at_s: float
    to_fraction: float | None = None
    to_bytes: int | None = None
    for_s: float | None = None

    def spec(self) -> str:
        to = f"{self.to_fraction * 100:g}%" if self.to_fraction is not None else str(self.to_bytes)
        tail = f",for={self.for_s}s" if self.for_s is not None else ""
        return f"squeeze:at={self.at_s}s,to={to}{tail}"

    def squeezed_bytes(self, base_bytes: int) -> int:
        if self.to_bytes is not None:
            return min(self.to_bytes, base_bytes)
        assert self.to_fraction is not None
        return int(base_bytes * self.to_fraction)


@dataclass(frozen=True, kw_only=True)
class Telemetry:
    """Samples every ``period_s``; each quantity ramps linearly from start to end over ``over_s``."""

    period_s: float
    temperature_c: tuple[float, float] | None = None
    power_w: tuple[float, float] | None = None
    fps: tuple[float, float] | None = None
    over_s: float = 10.0

    def spec(self) -> str:
        parts = [f"telemetry:period={self.period_s}s"]
        for key, value in (("temp", self.temperature_c), ("power", self.power_w), ("fps", self.fps)):
            if value is not None:
                parts.append(f"{key}={value[0]:g}..{value[1]:g}")
        return ",".join(parts) + f",over={self.over_s}s"

    def sample(self, time_s: float) -> TelemetrySample:
        w = min(max(time_s / self.over_s, 0.0), 1.0) if self.over_s > 0 else 1.0

        def at(r: tuple[float, float] | None) -> float | None:
            return None if r is None else r[0] + (r[1] - r[0]) * w

        return TelemetrySample(
            time_s=time_s, temperature_c=at(self.temperature_c), power_w=at(self.power_w), fps=at(self.fps)
        )


@dataclass(frozen=True, kw_only=True)
class TelemetrySample:
    """One simulated reading; None = the device has no such sensor."""

    time_s: float
    temperature_c: float | None = None
    power_w: float | None = None
    fps: float | None = None


Injection = Jitter | Squeeze | Telemetry

_KEYS: dict[str, tuple[set[str], set[str]]] = {  # kind -> (required, optional)
    "jitter": ({"size", "period"}, {"hold"}),
    "squeeze": ({"at", "to"}, {"for"}),
    "telemetry": ({"period"}, {"temp", "power", "fps", "over"}),
}


def parse_inject(text: str) -> Injection:
    """``KIND:key=value,...`` -> a spec; one InputError naming the problem and the grammar otherwise."""
    try:
        return _parse(str(text))
    except (ValueError, KeyError) as exc:
        reason = exc.args[0] if exc.args else exc.__class__.__name__
        raise InputError(f"bad --inject spec {str(text)[:200]!r}: {reason}; expected {GRAMMAR}") from None


def _parse(text: str) -> Injection:
    if len(text) > 1000:
        raise ValueError("longer than 1000 characters")
    kind, sep, rest = text.strip().partition(":")
    if not sep or kind not in _KEYS:
        raise ValueError(f"unknown kind {kind!r}")
    fields: dict[str, str] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise ValueError(f"{item!r} is not key=value")
        if key in fields:
            raise ValueError(f"{key!r} given twice")
        fields[key] = value
    required, optional = _KEYS[kind]
    if missing := required - set(fields):
        raise ValueError(f"{kind} needs {', '.join(sorted(missing))}")
    if unknown := set(fields) - required - optional:
        raise ValueError(f"{kind} has no {', '.join(sorted(unknown))}")
    if kind == "jitter":
        size_bytes = parse_bytes(fields["size"])
        period_s = parse_duration_s(fields["period"])
        hold_s = parse_duration_s(fields["hold"]) if "hold" in fields else period_s / 2
        if size_bytes < PAGE_BYTES or period_s <= 0:
            raise ValueError(f"size must be at least one page ({PAGE_BYTES} B) and period positive")
        return Jitter(size_bytes=size_bytes, period_s=period_s, hold_s=min(hold_s, period_s))
    if kind == "squeeze":
        to = fields["to"]
        fraction = to_bytes = None
        if to.endswith("%"):
            fraction = float(to[:-1]) / 100
            if not 0 < fraction <= 1:
                raise ValueError("to must be a percentage in (0, 100]")
        else:
            to_bytes = parse_bytes(to)
        for_s = parse_duration_s(fields["for"]) if "for" in fields else None
        return Squeeze(at_s=parse_duration_s(fields["at"]), to_fraction=fraction, to_bytes=to_bytes, for_s=for_s)
    period_s = parse_duration_s(fields["period"])
    if period_s < 1e-3:
        raise ValueError("period must be at least 1ms")
    ranges = {k: _range(fields[k]) if k in fields else None for k in ("temp", "power", "fps")}
    over_s = parse_duration_s(fields["over"]) if "over" in fields else 10.0
    return Telemetry(
        period_s=period_s, temperature_c=ranges["temp"], power_w=ranges["power"], fps=ranges["fps"], over_s=over_s
    )


# -- child side: limits ---------------------------------------------------------------


def apply_address_space_limit(limit_bytes: int) -> None:
    """Lower the soft RLIMIT_AS of this process (the hard limit stays, so a squeeze can end)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit_bytes = min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, hard))


def is_oom_error(exc: BaseException) -> bool:
    """MemoryError, torch.OutOfMemoryError, a CPU allocator failure (a RuntimeError in torch), or a
    request a governed session refused because it was predicted not to fit (``AdmissionError``:
    a memory failure handled before allocating, not a crash)."""
    if isinstance(exc, MemoryError) or type(exc).__name__ in ("OutOfMemoryError", "OutOfMemory", "AdmissionError"):
        return True
    text = str(exc)[:2000]
    return (
        isinstance(exc, RuntimeError | OSError)
        and any(s in text for s in _OOM_PHRASES)
        or (isinstance(exc, ImportError) and "failed to map segment" in text)
    )  # a shared library refused by the limit


# torch's DefaultCPUAllocator and CUDA caching allocator, numpy and the C library phrase it these ways; a thread
# whose stack cannot be mapped under the limit is the same failure.
_OOM_PHRASES = (
    "can't allocate memory",
    "out of memory",
    "Cannot allocate memory",
    "Unable to allocate",
    "can't start new thread",
)


# -- child side: jitter thread --------------------------------------------------------


@dataclass
class JitterStats:
    cycles: int = 0
    failed: int = 0  # mappings the limit refused: the other app was squeezed too
    touched_bytes: int = 0
    held_bytes: int = 0  # now
    last_error: str | None = None


def _touch(chunk: mmap.mmap) -> None:
    """Write every byte of ``chunk`` with the GIL released.

    Another app's page faults do not stop this interpreter; a slice assignment would hold
    the GIL for the ~0.1 s of faults per 128 MiB and stall the serving thread (ctypes
    releases the GIL around foreign calls).
    """
    buf = (ctypes.c_char * len(chunk)).from_buffer(chunk)
    try:
        ctypes.memset(ctypes.addressof(buf), 1, len(chunk))
    finally:
        del buf  # the export must go before the chunk can be unmapped


class JitterThread(threading.Thread):
    """Daemon thread: one chunk at a time, every page written so that it is resident."""

    def __init__(self, spec: Jitter) -> None:
        super().__init__(name="memwarden-jitter", daemon=True)
        self.spec = spec
        self.stats = JitterStats()
        self._stop_event = threading.Event()
        self.first_pass = threading.Event()  # set once the first chunk is resident (or was refused)

    def run(self) -> None:
        npages = self.spec.size_bytes // PAGE_BYTES
        while not self._stop_event.is_set():
            begin = time.monotonic()
            try:
                chunk = mmap.mmap(-1, npages * PAGE_BYTES)
            except (OSError, MemoryError) as exc:
                self.stats.failed += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                self.first_pass.set()
            else:
                try:
                    _touch(chunk)  # a write fault per page: the memory is really resident
                    self.stats.touched_bytes += npages * PAGE_BYTES
                    self.stats.held_bytes = npages * PAGE_BYTES
                    self.first_pass.set()
                    self._stop_event.wait(self.spec.hold_s)
                finally:
                    chunk.close()  # munmap: returned to the OS at once, unlike a malloc'd buffer
                    self.stats.held_bytes = 0
            self.stats.cycles += 1
            self._stop_event.wait(max(0.0, self.spec.period_s - (time.monotonic() - begin)))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


# -- child side: squeezes and telemetry on a schedule -----------------------------------


@dataclass
class Schedule:
    """Runs squeezes and telemetry from ``start()``; a daemon thread, stdlib only.

    ``on_limit(bytes)`` is called with each new limit (the runner lowers RLIMIT_AS and the
    serving budget); ``on_telemetry(sample)`` with each sample. Squeezes are relative to
    ``base_limit_bytes`` (the configured limit) and do not stack: the latest one wins, and
    when its ``for_s`` ends the limit goes back to the base.
    """

    squeezes: list[Squeeze]
    telemetry: list[Telemetry]
    base_limit_bytes: int | None
    on_limit: Callable[[int], None]
    on_telemetry: Callable[[TelemetrySample], None]
    events: list[dict[str, Any]] = field(default_factory=list)  # what happened when, for the record
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Schedule:
        if self.squeezes or self.telemetry:
            self._thread = threading.Thread(target=self._run, name="memwarden-schedule", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _timeline(self) -> list[tuple[float, str, Any]]:
        items: list[tuple[float, str, Any]] = []
        for sq in self.squeezes:
            if self.base_limit_bytes is None and sq.to_bytes is None:
                continue  # a fraction of no limit is no limit
            items.append((sq.at_s, "limit", sq.squeezed_bytes(self.base_limit_bytes or sq.to_bytes or 0)))
            if sq.for_s is not None:
                items.append((sq.at_s + sq.for_s, "limit", self.base_limit_bytes))
        return sorted(items, key=lambda item: item[0])

    def _run(self) -> None:
        t0 = time.monotonic()
        pending = self._timeline()
        next_sample = [0.0] * len(self.telemetry)
        while not self._stop.is_set():
            now = time.monotonic() - t0
            while pending and pending[0][0] <= now:
                _, _, limit = pending.pop(0)
                if limit is not None:
                    self.events.append({"time_s": round(now, 4), "limit_bytes": limit})
                    self.on_limit(limit)
            for i, tel in enumerate(self.telemetry):
                if next_sample[i] <= now:
                    self.on_telemetry(tel.sample(now))
                    next_sample[i] = now + tel.period_s
            waits = [p[0] - now for p in pending[:1]] + [t - now for t in next_sample]
            if not waits:
                return
            self._stop.wait(max(0.001, min(waits)))
