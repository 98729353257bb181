"""A device's compute units, for partitioning a graph across them: the ``[[compute_units]]``
section of a device profile.

Each unit says which op types it runs for which dtypes, how fast per op class, how much it can
hold and what moving a tensor in or out of it costs::

    [[compute_units]]
    name = "htp"                      # unique in the profile; the first unit of kind "cpu" is the fallback
    kind = "npu"                      # cpu | gpu | npu | dsp | dla | ane
    priority = 0                      # ORT-style execution-provider order: lower claims first
    memory_bytes = 2_147_483_648      # what the unit can hold (weights + live activations)
    dtypes = ["fp16", "int8"]
    ops = ["MatMul", "Gemm", ...]     # ONNX op types; ["*"] = every op
    launch_us = 15.0                  # per-node dispatch cost
    transfer_bandwidth_gbps = 20.0    # moving a tensor into or out of this unit (GB/s)
    transfer_latency_us = 60.0        # fixed cost per transfer
    [compute_units.throughput_gops]   # sustained rate per op class (10^9 ops/s)
    matmul = 4000.0                   # classes: matmul conv elementwise reduce data other
    ...

``memwarden.models.devices`` accepts the section (it only checks the key); this module parses
and checks it as strictly, since a unit decides where a partitioner may put a node. Figures in
the built-in profiles carry their source or the word "assumption".
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from memwarden.errors import InputError
from memwarden.models.device_profile import DTYPES
from memwarden.models.devices import MAX_FILE_BYTES, builtin_ids

__all__ = ["OP_CLASSES", "UNIT_KINDS", "ComputeUnitSpec", "load_compute_units", "parse_compute_units"]

UNIT_KINDS = ("cpu", "gpu", "npu", "dsp", "dla", "ane")
OP_CLASSES = ("matmul", "conv", "elementwise", "reduce", "data", "other")
_REQUIRED = (
    "name",
    "kind",
    "priority",
    "memory_bytes",
    "dtypes",
    "ops",
    "launch_us",
    "transfer_bandwidth_gbps",
    "transfer_latency_us",
    "throughput_gops",
)
_MAX_UNITS = 16


@dataclass(frozen=True, kw_only=True)
class ComputeUnitSpec:
    """One compute unit of a device, as a partitioner sees it."""

    name: str
    kind: str
    priority: int
    memory_bytes: int
    dtypes: frozenset[str]
    ops: frozenset[str]  # {"*"}: every op type
    launch_us: float
    transfer_bandwidth_gbps: float  # GB/s = 10^3 bytes/µs
    transfer_latency_us: float
    throughput_gops: dict[str, float]  # op class -> 10^9 ops/s; a class not listed cannot run here

    def supports(self, op_type: str, dtype: str, op_class: str) -> bool:
        return (
            ("*" in self.ops or op_type in self.ops)
            and dtype in self.dtypes
            and self.throughput_gops.get(op_class, 0) > 0
        )

    def compute_us(self, ops: float, op_class: str) -> float:
        """Time for ``ops`` operations of ``op_class``: launch + ops / rate (µs)."""
        rate = self.throughput_gops.get(op_class, 0.0)
        return math.inf if rate <= 0 else self.launch_us + ops / (rate * 1e3)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "priority": self.priority,
            "memory_bytes": self.memory_bytes,
            "dtypes": sorted(self.dtypes),
            "ops": sorted(self.ops),
            "launch_us": self.launch_us,
            "transfer_bandwidth_gbps": self.transfer_bandwidth_gbps,
            "transfer_latency_us": self.transfer_latency_us,
            "throughput_gops": dict(self.throughput_gops),
        }


def transfer_us(a: ComputeUnitSpec, b: ComputeUnitSpec, nbytes: int) -> float:
    """Moving ``nbytes`` from unit ``a`` to unit ``b``: the slower side's latency and bandwidth."""
    if a.name == b.name:
        return 0.0
    bandwidth = min(a.transfer_bandwidth_gbps, b.transfer_bandwidth_gbps)
    return max(a.transfer_latency_us, b.transfer_latency_us) + nbytes / (bandwidth * 1e3)


def _fail(label: str, where: str, problem: str) -> InputError:
    return InputError(f"{label}: {where}: {problem}")


def _number(label: str, where: str, value: Any, lo: float, hi: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not lo <= value <= hi
    ):
        raise _fail(label, where, f"{value!r} must be a number in [{lo:g}, {hi:g}]")
    return float(value)


def parse_compute_units(doc: dict[str, Any], *, label: str = "<profile>") -> tuple[ComputeUnitSpec, ...]:
    """The units of a parsed profile document; () where it has no ``[[compute_units]]``."""
    raw = doc.get("compute_units", [])
    if not isinstance(raw, list) or len(raw) > _MAX_UNITS:
        raise _fail(label, "compute_units", f"must be a list of at most {_MAX_UNITS} [[compute_units]] tables")
    units = []
    for i, t in enumerate(raw):
        where = f"compute_units[{i}]"
        if not isinstance(t, dict):
            raise _fail(label, where, "must be a table")
        missing = [k for k in _REQUIRED if k not in t]
        unknown = sorted(set(t) - set(_REQUIRED))
        if missing or unknown:
            raise _fail(label, where, f"missing {missing or 'nothing'}, unknown {unknown or 'nothing'}")
        name = t["name"]
        if not isinstance(name, str) or not name or len(name) > 40:
            raise _fail(label, f"{where}.name", "must be a short string")
        if t["kind"] not in UNIT_KINDS:
            raise _fail(label, f"{where}.kind", f"{t['kind']!r} is not one of {', '.join(UNIT_KINDS)}")
        dtypes = t["dtypes"]
        if not isinstance(dtypes, list) or not dtypes or any(d not in DTYPES for d in dtypes):
            raise _fail(label, f"{where}.dtypes", f"must list dtypes from {', '.join(DTYPES)}")
        ops = t["ops"]
        if not isinstance(ops, list) or not ops or any(not isinstance(o, str) or not o or len(o) > 64 for o in ops):
            raise _fail(label, f"{where}.ops", 'must list ONNX op types (or "*")')
        rates = t["throughput_gops"]
        if not isinstance(rates, dict) or not rates or any(k not in OP_CLASSES for k in rates):
            raise _fail(label, f"{where}.throughput_gops", f"must map op classes ({', '.join(OP_CLASSES)}) to rates")
        units.append(
            ComputeUnitSpec(
                name=name,
                kind=t["kind"],
                priority=int(_number(label, f"{where}.priority", t["priority"], 0, 100)),
                memory_bytes=int(_number(label, f"{where}.memory_bytes", t["memory_bytes"], 1 << 16, 1 << 44)),
                dtypes=frozenset(dtypes),
                ops=frozenset(ops),
                launch_us=_number(label, f"{where}.launch_us", t["launch_us"], 0, 1e6),
                transfer_bandwidth_gbps=_number(
                    label, f"{where}.transfer_bandwidth_gbps", t["transfer_bandwidth_gbps"], 1e-3, 1e5
                ),
                transfer_latency_us=_number(label, f"{where}.transfer_latency_us", t["transfer_latency_us"], 0, 1e6),
                throughput_gops={
                    k: _number(label, f"{where}.throughput_gops.{k}", v, 0, 1e7) for k, v in rates.items()
                },
            )
        )
    names = [u.name for u in units]
    if len(set(names)) != len(names):
        raise _fail(label, "compute_units", f"unit names repeat: {names}")
    if units and not any(u.kind == "cpu" and "*" in u.ops for u in units):
        raise _fail(
            label, "compute_units", 'needs a unit of kind "cpu" with ops = ["*"] (the fallback every node can use)'
        )
    return tuple(units)


def load_compute_units(path_or_id: str | os.PathLike[str]) -> tuple[ComputeUnitSpec, ...]:
    """The compute units of a built-in profile id or a profile file; InputError where it has none."""
    text = os.fspath(path_or_id)
    if text in builtin_ids():
        data = resources.files("memwarden.models").joinpath("devices", f"{text}.toml").read_bytes()
        label = f"built-in profile {text}.toml"
    else:
        path = Path(text)
        if not path.is_file():
            raise InputError(f"{text}: no such device profile (built-in devices: {', '.join(builtin_ids())})")
        if path.stat().st_size > MAX_FILE_BYTES:
            raise InputError(f"{text}: larger than {MAX_FILE_BYTES} bytes; not a device profile")
        data = path.read_bytes()
        label = text
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{label}: not valid TOML ({exc})") from None
    units = parse_compute_units(doc, label=label)
    if not units:
        with_units = [
            i
            for i in builtin_ids()
            if "[[compute_units]]" in resources.files("memwarden.models").joinpath("devices", f"{i}.toml").read_text()
        ]
        raise InputError(f"{label}: has no [[compute_units]]; profiles with them: {', '.join(with_units) or 'none'}")
    return units
