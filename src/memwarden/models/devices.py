"""Device profiles: how much memory a device leaves a model, in which tiers, at what speed.

A profile is one TOML file (built-ins live in ``models/devices/<id>.toml``, each figure with its
public source in a comment). Loading is strict because a profile decides whether `estimate`
says "fits": an unknown key, a string where a number belongs or a size off by orders of
magnitude is an :class:`~memwarden.errors.InputError` naming the file and the field, never a
silently wrong verdict. Parsing is ``tomllib`` only; nothing in a file is executed.

Units: bytes; ``bandwidth_gbps`` in GB/s (10^9 bytes per second, peak); ``latency_us`` in
microseconds; ``peak_tflops`` in dense TFLOPS (TOPS for integer types), i.e. without 2:4
structured sparsity.

Memory model: ``total_memory_bytes`` is the memory the accelerator computes from (the GPU's
VRAM/HBM, or the one shared pool of a unified-memory device) and ``os_reserved_bytes`` the share
a model cannot have (OS, display, driver, CUDA context, the per-app limit of a phone OS).
On a unified device that pool is the ``host`` tier and there is no separate ``device`` tier.
"""

from __future__ import annotations

import math
import os
import re
import stat
import sys
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from memwarden.errors import InputError
from memwarden.models.device_limits import ENTITLED as _ENTITLED
from memwarden.models.device_limits import LIMIT_KINDS, KillLimit, entitled_profile
from memwarden.models.device_profile import DTYPES, ComputeSpec, ComputeUnit, DeviceProfile, MemoryTier, PeakRates

__all__ = [
    "builtin_ids",
    "list_profiles",
    "load_profile",
    "parse_profile",
]

MAX_FILE_BYTES = 1 << 20  # a profile is a few KiB; anything past 1 MiB is not one
KINDS = ("phone", "sbc", "jetson", "laptop", "gpu", "datacenter")
TIER_NAMES = ("device", "host", "disk")
ACCELERATORS = (
    "cpu",
    "neon",
    "sve",
    "avx2",
    "avx512",
    "amx",
    "gpu",
    "cuda",
    "tensor_cores",
    "dla",
    "pva",
    "metal",
    "mps",
    "vulkan",
    "opencl",
    "npu",
    "ane",
    "hexagon",
    "nnapi",
    "coreml",
)
TELEMETRY_SOURCES = (
    "nvml",
    "dcgm",
    "tegrastats",
    "thermal_zone",
    "psutil",
    "vcgencmd",
    "powermetrics",
    "macos_thermal_state",
    "ios_thermal_state",
    "os_proc_available_memory",
    "android_thermal_status",
    "android_memory_info",
)

# Bounds reject typos by orders of magnitude (a size in KB, a bandwidth in bit/s), not unusual hardware.
MIN_MEMORY_BYTES = 1 << 20  # 1 MiB
MAX_MEMORY_BYTES = 1 << 44  # 16 TiB of memory behind one accelerator
MAX_TIER_BYTES = 1 << 50  # 1 PiB: the disk tier of a large server
MAX_BANDWIDTH_GBPS = 100_000.0  # 100 TB/s, ~20x today's fastest HBM
MAX_LATENCY_US = 10_000_000.0  # 10 s
MAX_TFLOPS = 100_000.0  # 100 PFLOPS dense on one device
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_MAX_NAME_CHARS = 120


# ---------------------------------------------------------------------------------------------
# Loading


def builtin_ids() -> list[str]:
    """Ids of the profiles shipped with memwarden, sorted."""
    return sorted(name[: -len(".toml")] for name in _builtin_files())


def list_profiles() -> list[DeviceProfile]:
    """Every built-in profile, smallest usable memory first (ties by id)."""
    return sorted((_load_builtin(i) for i in builtin_ids()), key=lambda p: (p.usable_bytes, p.id))


def load_profile(path_or_id: str | os.PathLike[str]) -> DeviceProfile:
    """A built-in profile by id (``jetson-orin-nano-8gb``) or a user's TOML file by path.

    Raises InputError for an unknown id (listing the valid ones), a file that cannot be read,
    is larger than 1 MiB, is not TOML, or breaks the schema (naming the field).
    """
    if not isinstance(path_or_id, os.PathLike):
        text = str(path_or_id)
        if text in builtin_ids():
            return _load_builtin(text)
        if text.endswith(_ENTITLED) and text.removesuffix(_ENTITLED) in builtin_ids():
            return entitled_profile(_load_builtin(text.removesuffix(_ENTITLED)))
        if not _looks_like_path(text) and not Path(text).is_file():
            raise InputError(
                f"unknown device {text!r}; built-in devices: {', '.join(builtin_ids())} "
                "(or give the path of a .toml profile)"
            )
    return _load_path(Path(path_or_id))


def parse_profile(data: bytes, *, label: str = "<profile>", source: str = "") -> DeviceProfile:
    """Validate the bytes of a TOML profile into a DeviceProfile. Pure: no I/O."""
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"{label}: {len(data)} bytes; a device profile is at most {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{label}: not UTF-8 text (bad byte at offset {exc.start})") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{label}: not valid TOML: {exc}") from None
    except ValueError as exc:  # e.g. an integer longer than Python's int-conversion digit limit
        raise InputError(f"{label}: not a usable TOML value: {exc}") from None
    except RecursionError:
        raise InputError(f"{label}: not valid TOML: arrays or tables nested too deeply") from None
    return _Reader(label).profile(doc, source=source or label)


def _looks_like_path(text: str) -> bool:
    return text.endswith(".toml") or "/" in text or os.sep in text or bool(os.altsep and os.altsep in text)


@cache
def _builtin_files() -> frozenset[str]:
    folder = resources.files("memwarden.models").joinpath("devices")
    return frozenset(p.name for p in folder.iterdir() if p.name.endswith(".toml") and p.is_file())


@cache
def _load_builtin(ident: str) -> DeviceProfile:
    data = resources.files("memwarden.models").joinpath("devices", f"{ident}.toml").read_bytes()
    profile = parse_profile(data, label=f"built-in profile {ident}.toml", source=f"builtin:{ident}")
    if profile.id != ident:
        raise InputError(f"built-in profile {ident}.toml: id {profile.id!r} differs from its file name")
    return profile


def _load_path(path: Path) -> DeviceProfile:
    label = str(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise InputError(f"{label}: no such file (built-in devices: {', '.join(builtin_ids())})") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise InputError(f"{label!r}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    if not stat.S_ISREG(st.st_mode):  # a directory, FIFO or device would block or never end
        raise InputError(f"{label}: not a regular file")
    if st.st_size > MAX_FILE_BYTES:
        raise InputError(f"{label}: {st.st_size} bytes; a device profile is at most {MAX_FILE_BYTES} bytes")
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)  # the file may have grown since stat()
    except OSError as exc:
        raise InputError(f"{label}: cannot read ({exc.strerror or exc})") from None
    return parse_profile(data, label=label, source=label)


# ---------------------------------------------------------------------------------------------
# Validation: one method per table; every message is "<file>: <field>: <problem>".

_TOP_REQUIRED = (
    "name",
    "id",
    "kind",
    "total_memory_bytes",
    "os_reserved_bytes",
    "unified_memory",
    "tiers",
    "compute",
    "telemetry",
)


class _Reader:
    def __init__(self, label: str) -> None:
        self.label = label

    def fail(self, where: str, problem: str) -> NoReturn:
        raise InputError(f"{self.label}: {where}: {problem}")

    def profile(self, doc: dict[str, Any], *, source: str) -> DeviceProfile:
        self.keys("the top level", doc, _TOP_REQUIRED, ("limit", "compute_units"))  # units: models.compute_units
        ident = self.string("id", doc["id"])
        if not _ID.match(ident):
            self.fail("id", f"{ident!r} must be lowercase letters, digits and '-' (at most 64), like the file name")
        total = self.integer("total_memory_bytes", doc["total_memory_bytes"], MIN_MEMORY_BYTES, MAX_MEMORY_BYTES)
        reserved = self.integer("os_reserved_bytes", doc["os_reserved_bytes"], 0, MAX_MEMORY_BYTES)
        if reserved >= total:
            self.fail("os_reserved_bytes", f"{reserved} leaves nothing of total_memory_bytes {total}")
        unified = self.boolean("unified_memory", doc["unified_memory"])
        tiers = self.tiers(doc["tiers"], total=total, unified=unified)
        compute = self.compute(self.table("compute", doc["compute"]))
        telemetry = self.telemetry(self.table("telemetry", doc["telemetry"]))
        return DeviceProfile(
            id=ident,
            name=self.string("name", doc["name"]),
            kind=self.choice("kind", doc["kind"], KINDS),
            total_memory_bytes=total,
            os_reserved_bytes=reserved,
            unified_memory=unified,
            tiers=tiers,
            compute=compute,
            telemetry=telemetry,
            source=source,
            limit=self.limit(self.table("limit", doc["limit"]), total) if "limit" in doc else None,
        )

    def limit(self, t: dict[str, Any], total: int) -> KillLimit:
        self.keys("limit", t, ("kind", "app_bytes", "source"), ("entitled_bytes",))
        app = self.integer("limit.app_bytes", t["app_bytes"], MIN_MEMORY_BYTES, total)
        entitled = t.get("entitled_bytes")
        if entitled is not None:
            entitled = self.integer("limit.entitled_bytes", entitled, app, total)
        return KillLimit(
            kind=self.choice("limit.kind", t["kind"], LIMIT_KINDS),
            app_bytes=app,
            entitled_bytes=entitled,
            source=self.string("limit.source", t["source"]),
        )

    def tiers(self, value: Any, *, total: int, unified: bool) -> tuple[MemoryTier, ...]:
        if not isinstance(value, list) or not value:
            self.fail("tiers", f"expected one or more [[tiers]] tables, got {_kind(value)}")
        if len(value) > len(TIER_NAMES):
            self.fail("tiers", f"{len(value)} tiers; at most one each of {', '.join(TIER_NAMES)}")
        tiers: list[MemoryTier] = []
        for i, raw in enumerate(value):
            where = f"tiers[{i}]"
            t = self.table(where, raw)
            self.keys(where, t, ("name", "capacity_bytes", "bandwidth_gbps", "latency_us"), ())
            name = self.choice(f"{where}.name", t["name"], TIER_NAMES)
            if any(prev.name == name for prev in tiers):
                self.fail(f"{where}.name", f"a second {name!r} tier")
            tiers.append(
                MemoryTier(
                    name=name,
                    capacity_bytes=self.integer(f"{where}.capacity_bytes", t["capacity_bytes"], 1, MAX_TIER_BYTES),
                    bandwidth_gbps=self.number(f"{where}.bandwidth_gbps", t["bandwidth_gbps"], MAX_BANDWIDTH_GBPS),
                    latency_us=self.number(f"{where}.latency_us", t["latency_us"], MAX_LATENCY_US),
                )
            )
        by_name = {t.name: t for t in tiers}
        # The accelerator's own pool must be described consistently with total_memory_bytes.
        pool = "host" if unified else "device"
        if unified and "device" in by_name:
            self.fail(
                "tiers", "unified_memory = true but a separate 'device' tier is listed; the shared pool is 'host'"
            )
        if pool not in by_name:
            self.fail("tiers", f"no {pool!r} tier (the pool total_memory_bytes describes)")
        if by_name[pool].capacity_bytes != total:
            self.fail(
                f"tiers[{tiers.index(by_name[pool])}].capacity_bytes",
                f"{by_name[pool].capacity_bytes} differs from total_memory_bytes {total} ({pool!r} is that pool)",
            )
        return tuple(tiers)

    def compute(self, t: dict[str, Any]) -> ComputeSpec:
        self.keys("compute", t, ("accelerators",), ("peak_tflops", "units"))
        units_raw = t.get("units", [])
        if not isinstance(units_raw, list):
            self.fail("compute.units", f"expected [[compute.units]] tables, got {_kind(units_raw)}")
        units: list[ComputeUnit] = []
        for i, raw in enumerate(units_raw):
            where = f"compute.units[{i}]"
            u = self.table(where, raw)
            self.keys(where, u, ("name", "kind", "peak_tflops"), ())
            name = self.string(f"{where}.name", u["name"])
            if any(prev.name == name for prev in units):
                self.fail(f"{where}.name", f"a second unit named {name!r}")
            units.append(
                ComputeUnit(
                    name=name,
                    kind=self.choice(f"{where}.kind", u["kind"], ACCELERATORS),
                    peak_tflops=self.rates(f"{where}.peak_tflops", u["peak_tflops"]),
                )
            )
        return ComputeSpec(
            accelerators=self.string_list("compute.accelerators", t["accelerators"], ACCELERATORS),
            peak_tflops=self.rates("compute.peak_tflops", t.get("peak_tflops", {})),
            units=tuple(units),
        )

    def rates(self, where: str, value: Any) -> PeakRates:
        t = self.table(where, value)
        self.keys(where, t, (), DTYPES)
        return PeakRates(**{d: self.number(f"{where}.{d}", v, MAX_TFLOPS) for d, v in t.items()})

    def telemetry(self, t: dict[str, Any]) -> tuple[str, ...]:
        self.keys("telemetry", t, ("sources",), ())
        return self.string_list("telemetry.sources", t["sources"], TELEMETRY_SOURCES)

    # -- scalars ---------------------------------------------------------------------------

    def keys(self, where: str, t: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...]) -> None:
        missing = [k for k in required if k not in t]
        if missing:
            self.fail(where, f"missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
        unknown = sorted(set(t) - set(required) - set(optional))
        if unknown:
            allowed = ", ".join((*required, *optional))
            self.fail(
                where, f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} (allowed: {allowed})"
            )

    def table(self, where: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, f"expected a table, got {_kind(value)}")
        return value

    def string(self, where: str, value: Any) -> str:
        if not isinstance(value, str):
            self.fail(where, f"expected a string, got {_kind(value)}")
        if not value.strip() or len(value) > _MAX_NAME_CHARS or not value.isprintable():
            self.fail(where, f"expected 1 to {_MAX_NAME_CHARS} printable characters, got {value[:40]!r}")
        return value

    def choice(self, where: str, value: Any, choices: tuple[str, ...]) -> str:
        text = self.string(where, value)
        if text not in choices:
            self.fail(where, f"{text!r} is not one of {', '.join(choices)}")
        return text

    def string_list(self, where: str, value: Any, choices: tuple[str, ...]) -> tuple[str, ...]:
        if not isinstance(value, list):
            self.fail(where, f"expected an array of strings, got {_kind(value)}")
        items = tuple(self.choice(f"{where}[{i}]", v, choices) for i, v in enumerate(value))
        if len(set(items)) != len(items):
            self.fail(where, "lists an entry twice")
        return items

    def boolean(self, where: str, value: Any) -> bool:
        if not isinstance(value, bool):
            self.fail(where, f"expected true or false, got {_kind(value)}")
        return value

    def integer(self, where: str, value: Any, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(where, f"expected a whole number of bytes, got {_kind(value)}")
        if not lo <= value <= hi:
            self.fail(where, f"{value} is outside the plausible range {lo}..{hi}")
        return value

    def number(self, where: str, value: Any, hi: float) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(where, f"expected a number, got {_kind(value)}")
        if not math.isfinite(value) or not 0 < value <= hi:
            self.fail(where, f"{value} is outside the plausible range (0, {hi:g}]")
        return float(value)


def _kind(value: Any) -> str:
    """How a TOML value reads in an error message: "a string ('fast')", "an array", ..."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a float ({value})"
    if isinstance(value, str):
        return f"a string ({value[:40]!r})"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"  # TOML dates and times
