"""Telemetry: one interface over the signals a device offers, each source optional.

Sources, most specific first (when two give the same field, the earlier one wins):

- ``nvml``: NVIDIA's management library through nvidia-ml-py: device memory, GPU temperature,
  power and its enforced limit, clock-throttle reasons. Each query is probed once at start and
  dropped if unsupported, because on Jetson and other unified-memory devices memory info
  raises NOT_SUPPORTED on every call.
- ``limits``: this process's cgroup (v2/v1) and ``RLIMIT_AS`` (``govern/limits.py``), where it has
  one: inside a container the host's figures overstate what the process may use.
- ``tegrastats``: Jetson's tool, run as a child process and parsed (:func:`parse_tegrastats`).
- ``psutil``: available memory and swap of the host, hwmon temperatures.
- ``thermal_zone``: ``/sys/class/thermal/thermal_zone*/temp`` (millidegrees C); the hottest zone.
- ``app_fps``: the frame rate the application reports through an :class:`FpsMeter`.

A source that is missing, unsupported or fails at start is not used; one that fails while
running is skipped for that sample and dropped after ``max_failures`` failures in a row, so
the next source's value for that field takes over. Telemetry never raises from ``sample()``.

Recorded logs replay through :class:`ReplaySource` (in ``telemetry_log``, re-exported here): JSON lines, one sample each,
``{"t": seconds, "mem_total_bytes", "mem_available_bytes", "temp_c", "power_w", "fps"}``
(every field but ``t`` may be missing; ``swap_used_bytes``, ``swap_total_bytes``,
``power_limit_w`` and ``throttle_reasons`` are read too; other keys are ignored so that
loggers can add their own), or a recorded tegrastats log.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from memwarden.govern.limits import LimitsSource, read_limits

__all__ = [
    "FIELDS",
    "FpsMeter",
    "NvmlSource",
    "PsutilSource",
    "TegrastatsSource",
    "Telemetry",
    "TelemetrySample",
    "TelemetrySource",
    "ThermalZoneSource",
    "detect_sources",
    "parse_tegrastats",
]

Reading = dict[str, float]  # a source's partial view: field name -> value

_INT_FIELDS = ("mem_total_bytes", "mem_available_bytes", "swap_used_bytes", "swap_total_bytes", "throttle_reasons")
_FLOAT_FIELDS = ("temp_c", "power_w", "power_limit_w", "fps")
FIELDS = _INT_FIELDS + _FLOAT_FIELDS
_MAX_BYTES = 1 << 62
_MIN_TEMP_C, _MAX_TEMP_C = -273.15, 1000.0


@dataclass(frozen=True, kw_only=True)
class TelemetrySample:
    """The device's signals at one moment. ``None`` = not measured (no source, or unreadable)."""

    t_s: float  # seconds; live: time.monotonic(); replay: the log's "t"
    mem_total_bytes: int | None = None  # the pool the model runs from (GPU memory, or the unified pool)
    mem_available_bytes: int | None = None  # what can still be allocated without swapping or OOM
    swap_used_bytes: int | None = None
    swap_total_bytes: int | None = None
    temp_c: float | None = None  # the hottest relevant sensor
    power_w: float | None = None  # board/GPU input power now
    power_limit_w: float | None = None  # the enforced power cap, where the device says
    fps: float | None = None  # frames per second the application achieves
    throttle_reasons: int | None = None  # NVML clocks-event bitmask (SwThermal 0x20, HwThermal 0x40)

    def to_json(self) -> dict[str, Any]:
        """The replay-log form: ``{"t": ..., <measured fields>}``."""
        out: dict[str, Any] = {"t": self.t_s}
        out.update({k: v for k in FIELDS if (v := getattr(self, k)) is not None})
        return out

    @classmethod
    def from_json(cls, obj: Any) -> TelemetrySample:
        """Validate one log record. Raises ValueError saying what is wrong with it.

        ``t`` must be a finite number. A signal may be missing, null or NaN (a sensor that could
        not be read): all mean "not measured". Infinite, negative (temperatures: below absolute
        zero), boolean or non-numeric values are errors, as is available memory above the total.
        """
        if not isinstance(obj, dict):
            raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
        if "t" not in obj:
            raise ValueError('missing "t" (seconds)')
        t = _number("t", obj["t"])
        if t is None or not math.isfinite(t):
            raise ValueError(f'"t" must be a finite number of seconds, got {obj["t"]!r}')
        values: dict[str, Any] = {}
        for name in FIELDS:
            v = _number(name, obj.get(name))
            if v is None or math.isnan(v):
                continue
            lo = _MIN_TEMP_C if name == "temp_c" else 0.0
            hi = _MAX_TEMP_C if name == "temp_c" else float(_MAX_BYTES)
            if not lo <= v <= hi:
                raise ValueError(f'"{name}" = {obj[name]!r} is outside {lo:g}..{hi:g}')
            values[name] = int(v) if name in _INT_FIELDS else float(v)
        total, avail = values.get("mem_total_bytes"), values.get("mem_available_bytes")
        if total is not None and avail is not None and avail > total:
            raise ValueError(f'"mem_available_bytes" {avail} exceeds "mem_total_bytes" {total}')
        return cls(t_s=float(t), **values)

    @classmethod
    def from_reading(cls, t_s: float, reading: Reading) -> TelemetrySample:
        values: dict[str, Any] = {k: (int(v) if k in _INT_FIELDS else float(v)) for k, v in reading.items()}
        return cls(t_s=t_s, **values)


def _number(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f'"{name}" must be a number, got {json.dumps(value)[:40]}')
    if isinstance(value, int) and value.bit_length() > 64:  # float() of a 400-digit integer overflows
        raise ValueError(f'"{name}" is a {len(str(abs(value)))}-digit number, out of range')
    return float(value)


class TelemetrySource(Protocol):
    name: str

    def read(self) -> Reading: ...

    def close(self) -> None: ...


class SourceUnavailable(Exception):
    """Raised by a source's constructor when it does not apply here (no library, no device)."""


# ---------------------------------------------------------------------------------------------
# Live sources


class NvmlSource:
    """NVML through nvidia-ml-py. Only the queries that work at start are kept."""

    name = "nvml"

    def __init__(self, index: int = 0) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # no library, no driver (NVMLError_LibraryNotFound), no GPU
            raise SourceUnavailable(f"nvml: {exc}") from None
        self._nvml = pynvml
        h = self._handle
        throttle = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        candidates: list[Callable[[], Reading]] = [
            lambda: _nvml_memory(pynvml.nvmlDeviceGetMemoryInfo(h)),
            lambda: {"temp_c": float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))},
            lambda: {"power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0},  # mW
            lambda: {"power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0},  # mW
        ]
        if throttle is not None:
            candidates.append(lambda: {"throttle_reasons": float(throttle(h))})
        self._queries = []
        for query in candidates:
            try:
                query()
            except Exception:  # NVMLError_NotSupported on Jetson; anything else: same, skip it
                continue
            self._queries.append(query)
        if not self._queries:
            self.close()
            raise SourceUnavailable("nvml: no supported query")

    def read(self) -> Reading:
        out: Reading = {}
        for query in self._queries:
            try:
                out.update(query())
            except self._nvml.NVMLError:  # a transient failure of one query loses only its fields
                continue
        return out

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass


def _nvml_memory(info: Any) -> Reading:
    return {"mem_total_bytes": float(info.total), "mem_available_bytes": float(info.free)}


class PsutilSource:
    """Host memory and swap; the hottest hwmon sensor where psutil can read them (Linux, FreeBSD)."""

    name = "psutil"

    def __init__(self) -> None:
        try:
            import psutil
        except ImportError:
            raise SourceUnavailable("psutil: not installed") from None
        self._psutil = psutil
        self._temps = hasattr(psutil, "sensors_temperatures")

    def read(self) -> Reading:
        vm = self._psutil.virtual_memory()
        out: Reading = {"mem_total_bytes": float(vm.total), "mem_available_bytes": float(vm.available)}
        try:
            sw = self._psutil.swap_memory()
            out.update(swap_used_bytes=float(sw.used), swap_total_bytes=float(sw.total))
        except Exception:  # some containers have no readable swap accounting
            pass
        if self._temps:
            try:
                temps = [s.current for group in self._psutil.sensors_temperatures().values() for s in group]
            except Exception:
                temps, self._temps = [], False
            hottest = _hottest(temps)
            if hottest is not None:
                out["temp_c"] = hottest
        return out

    def close(self) -> None:
        pass


class ThermalZoneSource:
    """The hottest readable zone under ``root`` (default ``/sys/class/thermal``)."""

    name = "thermal_zone"

    def __init__(self, root: str | os.PathLike[str] = "/sys/class/thermal") -> None:
        self._files = sorted(Path(root).glob("thermal_zone*/temp"))
        if self.read().get("temp_c") is None:
            raise SourceUnavailable(f"thermal_zone: no readable zone under {root}")

    def read(self) -> Reading:
        temps = []
        for f in self._files:
            try:
                temps.append(int(f.read_text().strip()) / 1000.0)  # millidegrees C
            except (OSError, ValueError):  # some zones answer EIO/ENODATA while their sensor is off
                continue
        hottest = _hottest(temps)
        return {} if hottest is None else {"temp_c": hottest}

    def close(self) -> None:
        pass


def _hottest(temps: Iterable[float]) -> float | None:
    # Disabled sensors report sentinels such as -256 °C (Jetson); nothing real reads below -40.
    valid = [float(t) for t in temps if t is not None and math.isfinite(t) and -40.0 < t < 200.0]
    return max(valid) if valid else None


class TegrastatsSource:
    """``tegrastats --interval MS`` as a child process; ``read()`` gives its latest line."""

    name = "tegrastats"

    def __init__(self, executable: str | None = None, interval_ms: int = 500) -> None:
        exe = executable or shutil.which("tegrastats")
        if exe is None:
            raise SourceUnavailable("tegrastats: not on PATH (not a Jetson)")
        try:
            self._proc = subprocess.Popen(
                [exe, "--interval", str(interval_ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
        except OSError as exc:
            raise SourceUnavailable(f"tegrastats: {exc}") from None
        self._latest: Reading = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._pump, name="memwarden-tegrastats", daemon=True).start()

    def _pump(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                reading = parse_tegrastats(line)
            except ValueError:
                continue
            with self._lock:
                self._latest = reading

    def read(self) -> Reading:
        if self._proc.poll() is not None:
            raise RuntimeError(f"tegrastats exited with status {self._proc.returncode}")
        with self._lock:
            return dict(self._latest)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()


class FpsMeter:
    """The application's frame rate: call ``frame()`` per frame shown, or ``report(fps)``.

    Thread-safe (the application's thread reports, the governor's reads). The rate is frames in
    the last ``window_s`` over ``window_s``, so a stalled application reads as a falling rate
    instead of holding its last value.
    """

    name = "app_fps"

    def __init__(self, window_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._frames: deque[float] = deque()
        self._reported: float | None = None
        self._started: float | None = None
        self._lock = threading.Lock()

    def frame(self, count: int = 1) -> None:
        now = self._clock()
        with self._lock:
            if self._started is None:
                self._started = now
            self._frames.extend([now] * count)
            self._trim(now)

    def report(self, fps: float) -> None:
        with self._lock:
            self._reported = float(fps)

    def read(self) -> Reading:
        now = self._clock()
        with self._lock:
            if self._reported is not None:
                return {"fps": self._reported}
            if self._started is None:
                return {}
            self._trim(now)
            if now - self._started >= self.window_s:  # a full window: frames in it / its length
                return {"fps": len(self._frames) / self.window_s}
            if len(self._frames) < 2:
                return {}
            return {"fps": (len(self._frames) - 1) / max(self._frames[-1] - self._frames[0], 1e-6)}

    def _trim(self, now: float) -> None:
        while self._frames and self._frames[0] <= now - self.window_s:
            self._frames.popleft()

    def close(self) -> None:
        pass


def detect_sources(
    *,
    fps_meter: FpsMeter | None = None,
    thermal_root: str | os.PathLike[str] = "/sys/class/thermal",
    nvml_index: int = 0,
    tegrastats: bool = True,
) -> list[TelemetrySource]:
    """Every source that works here, most specific first. Never raises for a missing source."""
    makers: list[Callable[[], TelemetrySource]] = [lambda: NvmlSource(nvml_index)]
    if read_limits().limit_bytes is not None:  # a container or prlimit: the host's figures overstate
        makers.append(LimitsSource)
    if tegrastats:
        makers.append(TegrastatsSource)
    makers += [PsutilSource, lambda: ThermalZoneSource(thermal_root)]
    found: list[TelemetrySource] = []
    for make in makers:
        try:
            found.append(make())
        except Exception:  # SourceUnavailable, or a library failing in a way we did not foresee
            continue
    if fps_meter is not None:
        found.append(fps_meter)
    return found


class Telemetry:
    """Merges sources into one :class:`TelemetrySample` per ``sample()`` call."""

    def __init__(
        self, sources: Sequence[TelemetrySource], *, clock: Callable[[], float] = time.monotonic, max_failures: int = 3
    ) -> None:
        self._sources = list(sources)
        self._clock = clock
        self._max_failures = max_failures
        self._failures: dict[str, int] = {}
        self.errors: dict[str, str] = {}  # last error per source, for the user
        self.origin: dict[str, str] = {}  # field -> source that gave it in the last sample

    @classmethod
    def detect(cls, **kwargs: Any) -> Telemetry:
        """Telemetry over :func:`detect_sources` (same keyword arguments)."""
        return cls(detect_sources(**kwargs))

    @property
    def sources(self) -> tuple[TelemetrySource, ...]:
        return tuple(self._sources)

    def sample(self) -> TelemetrySample:
        merged: Reading = {}
        origin: dict[str, str] = {}
        for src in list(self._sources):
            try:
                reading = src.read()
            except Exception as exc:  # degrade: this sample goes without it; repeated failure drops it
                self.errors[src.name] = f"{type(exc).__name__}: {exc}"
                self._failures[src.name] = self._failures.get(src.name, 0) + 1
                if self._failures[src.name] >= self._max_failures:
                    self._sources.remove(src)
                    src.close()
                continue
            self._failures[src.name] = 0
            for k, v in reading.items():
                if k in FIELDS and k not in merged and v is not None and math.isfinite(v):
                    merged[k], origin[k] = v, src.name
        if "mem_available_bytes" in merged and merged["mem_available_bytes"] > merged.get("mem_total_bytes", math.inf):
            merged["mem_available_bytes"] = merged["mem_total_bytes"]  # two sources' sampling skew
        self.origin = origin
        return TelemetrySample.from_reading(self._clock(), merged)

    def close(self) -> None:
        for src in self._sources:
            src.close()

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# tegrastats text

_MIB = 1 << 20  # tegrastats' "MB" are MiB: it divides /proc/meminfo's kB by 1024
_UNIT_BYTES = {"kB": 1024, "KB": 1024, "MB": _MIB, "GB": 1 << 30}
_RAM = re.compile(r"\bRAM (\d+)/(\d+)(kB|KB|MB|GB)")
_SWAP = re.compile(r"\bSWAP (\d+)/(\d+)(kB|KB|MB|GB)")
_TEMP = re.compile(r"\b([A-Za-z][\w]*)@(-?\d+(?:\.\d+)?)C\b")
_RAIL = re.compile(r"\b([A-Z][A-Z0-9_]*) (\d+)(?:mW)?/(\d+)(?:mW)?(?=\s|$)")  # current/average, mW
_INPUT_RAILS = ("VDD_IN", "POM_5V_IN")  # the board's input rail: Orin Nano/NX, TX2/Xavier/Nano
_FAKE_SENSORS = ("PMIC",)  # older Jetsons print PMIC@100C, a constant, not a measurement


def parse_tegrastats(line: str) -> Reading:
    """One tegrastats line -> fields. Raises ValueError for a line without a RAM figure.

    Memory: ``RAM used/totalMB``; available = total - used (tegrastats' "used" leaves out the
    page cache, so this is close to MemAvailable). Temperature: the hottest ``NAME@xxC`` that
    is a real sensor. Power: the input rail (VDD_IN, POM_5V_IN) when listed, else the sum of
    all listed rails (AGX Orin lists only sub-rails), current value not the average.
    """
    ram = _RAM.search(line)
    if ram is None:
        raise ValueError("not a tegrastats line (no 'RAM used/totalMB')")
    unit = _UNIT_BYTES[ram.group(3)]
    used, total = int(ram.group(1)) * unit, int(ram.group(2)) * unit
    if total > _MAX_BYTES or used > _MAX_BYTES:
        raise ValueError(f"RAM {ram.group(1)}/{ram.group(2)}{ram.group(3)} is out of range (at most 2**62 bytes)")
    out: Reading = {"mem_total_bytes": float(total), "mem_available_bytes": float(max(0, total - used))}
    swap = _SWAP.search(line)
    if swap is not None:
        unit = _UNIT_BYTES[swap.group(3)]
        if max(int(swap.group(1)), int(swap.group(2))) * unit > _MAX_BYTES:
            raise ValueError(
                f"SWAP {swap.group(1)}/{swap.group(2)}{swap.group(3)} is out of range (at most 2**62 bytes)"
            )
        out.update(swap_used_bytes=float(int(swap.group(1)) * unit), swap_total_bytes=float(int(swap.group(2)) * unit))
    hottest = _hottest(float(v) for name, v in _TEMP.findall(line) if name not in _FAKE_SENSORS)
    if hottest is not None:
        out["temp_c"] = hottest
    found = [(name, now) for name, now, _avg in _RAIL.findall(line) if name != "NC"]
    if any(len(now) > 9 for _, now in found):  # 10^9 mW is a megawatt: a number past that is no rail
        name, now = next((n, v) for n, v in found if len(v) > 9)
        raise ValueError(f"rail {name} reads {now[:20]}{'...' if len(now) > 20 else ''} mW, out of range")
    rails = {name: int(now) for name, now in found}
    if rails:
        inputs = [rails[n] for n in _INPUT_RAILS if n in rails]
        out["power_w"] = (inputs[0] if inputs else sum(rails.values())) / 1000.0
    return out
