"""Byte quantities: formatting and parsing ("6GiB", "512MB", "1.5e9")."""

from __future__ import annotations

import math
import numbers
import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "k": 1024,
    "m": 1024**2,
    "g": 1024**3,
    "t": 1024**4,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: object) -> int:
    """'6GiB' -> 6442450944. Also a number of bytes: an int, a float, a numpy integer or float, or a
    0-dim array/tensor (whole bytes, rounded down). Raises ValueError with the accepted forms for a
    string or number that is no byte quantity, TypeError naming the type of anything else."""
    if isinstance(text, bool):  # True is an int to Python, never a budget
        raise TypeError(f"not a byte quantity: bool {text!r} (examples: 1048576, 512MiB, 6GiB, 2GB)")
    if isinstance(text, str):
        match = _PATTERN.match(text)
        unit = match.group(2).lower() if match else ""
        if not match or unit not in _UNITS:
            raise ValueError(f"not a byte quantity: {text!r} (examples: 1048576, 512MiB, 6GiB, 2GB)")
        value: float | int = float(match.group(1)) * _UNITS[unit]
    elif isinstance(text, numbers.Integral):  # int, numpy integers
        value = int(text)
    elif isinstance(text, numbers.Real):  # float, numpy floats
        value = float(text)
    elif getattr(text, "shape", None) == () and callable(getattr(text, "item", None)):
        return parse_bytes(text.item())  # type: ignore[attr-defined]  # a 0-dim numpy array or torch tensor
    else:
        shown = repr(text)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise TypeError(
            f"not a byte quantity: {type(text).__module__}.{type(text).__qualname__} {shown} "
            "(give a number of bytes or a string such as 512MiB or 6GiB)"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"byte quantity out of range: {text!r}")
    if value < 0 or value > 2**62:
        raise ValueError(f"byte quantity out of range: {text!r} (0 to 2**62 bytes)")
    return int(value)


def format_bytes(nbytes: float) -> str:
    """1536 -> '1.5 KiB'."""
    sign = "-" if nbytes < 0 else ""
    value = abs(float(nbytes))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    return f"{sign}{value:.1f} TiB"


def format_us(us: float) -> str:
    if us < 1000:
        return f"{us:.0f} µs"
    if us < 1_000_000:
        return f"{us / 1000:.1f} ms"
    return f"{us / 1_000_000:.2f} s"


# Bytes per element of every dtype name memwarden reads: torch's (``float16``, ``float8_e4m3fn``,
# quantized ``qint8``), safetensors' (``F16``, ``BF16``, ``I64``) and ONNX Runtime's (``float``,
# ``double``, ``float8e4m3fn``; 4-bit types take a byte each as ORT stores them unpacked). The one
# table: a reader that accepts only its format's names takes those keys (``SAFETENSORS_DTYPES``,
# ``ONNX_DTYPES``).
DTYPE_BYTES: dict[str, int] = {
    # torch
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "qint8": 1,
    "quint8": 1,
    "quint4x2": 1,
    # safetensors
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    # ONNX / ONNX Runtime (lower-cased TensorProto names and the profile's)
    "float": 4,
    "double": 8,
    "float8e4m3fn": 1,
    "float8e5m2": 1,
    "int4": 1,
    "uint4": 1,
}
SAFETENSORS_DTYPES = frozenset(
    ("BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "I64", "U64", "F64")
)
ONNX_DTYPES = frozenset(
    (
        "float",
        "float32",
        "double",
        "float64",
        "float16",
        "bfloat16",
        "int8",
        "uint8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "bool",
        "float8e4m3fn",
        "float8e5m2",
        "int4",
        "uint4",
    )
)
