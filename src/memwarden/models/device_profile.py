"""What a device profile says: memory tiers, compute units and peak rates, and the kill limit.

The frozen values ``models.devices`` reads a profile file into (strictly: see there). Units: bytes;
``bandwidth_gbps`` in GB/s (10^9 bytes per second, peak); ``latency_us`` in microseconds;
``peak_tflops`` in dense TFLOPS (TOPS for integer types). ``total_memory_bytes`` is the memory the
accelerator computes from and ``os_reserved_bytes`` the share a model cannot have.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from memwarden.models.device_limits import KillLimit

__all__ = ["DTYPES", "ComputeSpec", "ComputeUnit", "DeviceProfile", "MemoryTier", "PeakRates"]

DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")  # the peak-rate table's columns


@dataclass(frozen=True, kw_only=True)
class MemoryTier:
    """One place bytes can live: ``device`` (accelerator memory), ``host`` (system DRAM), ``disk``."""

    name: str
    capacity_bytes: int
    bandwidth_gbps: float  # GB/s, 10^9 bytes/s, peak
    latency_us: float  # time to the first byte of an access or transfer

    def transfer_us(self, nbytes: int) -> float:
        """Time to move ``nbytes`` at peak bandwidth: latency + size / bandwidth."""
        return self.latency_us + nbytes / (self.bandwidth_gbps * 1e3)  # bytes / (GB/s) = ns; /1e3 -> µs

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, kw_only=True)
class PeakRates:
    """Dense peak rate per dtype in TFLOPS (TOPS for int8/int4); None where no figure is published."""

    fp64: float | None = None
    fp32: float | None = None
    tf32: float | None = None
    fp16: float | None = None
    bf16: float | None = None
    fp8: float | None = None
    int8: float | None = None
    int4: float | None = None

    def get(self, dtype: str) -> float | None:
        if dtype not in DTYPES:
            raise KeyError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
        value: float | None = getattr(self, dtype)
        return value

    def to_json(self) -> dict[str, float]:
        return {d: v for d in DTYPES if (v := getattr(self, d)) is not None}


@dataclass(frozen=True, kw_only=True)
class ComputeUnit:
    """An engine besides the main one (a DLA, a Neural Engine, an NPU) with its own peak rates."""

    name: str
    kind: str  # one of ACCELERATORS
    peak_tflops: PeakRates

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "peak_tflops": self.peak_tflops.to_json()}


@dataclass(frozen=True, kw_only=True)
class ComputeSpec:
    accelerators: tuple[str, ...]  # what ops can run on: "cuda", "tensor_cores", "dla", "ane", "npu", ...
    peak_tflops: PeakRates  # the main compute engine (the GPU where there is one)
    units: tuple[ComputeUnit, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "accelerators": list(self.accelerators),
            "peak_tflops": self.peak_tflops.to_json(),
            "units": [u.to_json() for u in self.units],
        }


@dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    id: str
    name: str
    kind: str  # one of KINDS
    total_memory_bytes: int  # the memory the accelerator computes from
    os_reserved_bytes: int  # the share a model cannot have
    unified_memory: bool  # CPU and accelerator share one pool (then there is no "device" tier)
    tiers: tuple[MemoryTier, ...]
    compute: ComputeSpec
    telemetry: tuple[str, ...]  # sources that apply, from TELEMETRY_SOURCES
    source: str = field(default="", compare=False)  # "builtin:<id>" or the file it came from
    limit: KillLimit | None = None  # the OS's per-app kill limit, when it is below what the OS leaves

    @property
    def ram_bytes(self) -> int:
        """What the OS leaves of the memory: total minus its reserved share."""
        return self.total_memory_bytes - self.os_reserved_bytes

    @property
    def usable_bytes(self) -> int:
        """The bytes a model may peak at: what the OS leaves, and no more than its kill limit."""
        return min(self.ram_bytes, self.limit.bytes) if self.limit is not None else self.ram_bytes

    def headroom_bytes(self, peak_bytes: int) -> int:
        """Usable bytes left at a given peak; negative when it does not fit."""
        return self.usable_bytes - peak_bytes

    def has_tier(self, name: str) -> bool:
        return any(t.name == name for t in self.tiers)

    def tier(self, name: str) -> MemoryTier:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(f"{self.id} has no {name!r} tier (tiers: {', '.join(t.name for t in self.tiers)})")

    @property
    def compute_tier(self) -> MemoryTier:
        """The tier the accelerator computes from: ``device`` if it has its own memory, else ``host``."""
        return self.tier("host" if self.unified_memory else "device")

    @property
    def fastest_tier(self) -> MemoryTier:
        return max(self.tiers, key=lambda t: t.bandwidth_gbps)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "total_memory_bytes": self.total_memory_bytes,
            "os_reserved_bytes": self.os_reserved_bytes,
            "usable_bytes": self.usable_bytes,
            "unified_memory": self.unified_memory,
            "tiers": [t.to_json() for t in self.tiers],
            "compute": self.compute.to_json(),
            "telemetry": {"sources": list(self.telemetry)},
            "source": self.source,
            "limit": self.limit.to_json() if self.limit is not None else None,
        }
