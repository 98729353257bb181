"""A local checkpoint folder's tensors, from the safetensors headers only.

A ``.safetensors`` file is an 8-byte little-endian header length, a JSON header naming every
tensor's dtype, shape and byte range, then the data (https://github.com/huggingface/safetensors,
"Format"). Only the length and the header are read, never the data region, so a folder of
multi-gigabyte shards costs a few KiB of reads. ``.bin``/``.pt`` pickles are refused: reading
their shapes means running a pickle, and the project's restricted unpickler is for PyTorch
memory snapshots, not model files. Pure: no torch; dtypes come back as torch dtype names.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from memwarden.errors import InputError

__all__ = ["CheckpointTensors", "read_checkpoint", "read_header"]

_MAX_HEADER_BYTES = 100 * 1024**2  # safetensors' own limit (100 MB)
_MAX_FILES = 4096
# safetensors dtype -> (torch dtype name, bits per element)
_DTYPES = {
    "F64": ("float64", 64), "F32": ("float32", 32), "F16": ("float16", 16), "BF16": ("bfloat16", 16),
    "F8_E4M3": ("float8_e4m3fn", 8), "F8_E5M2": ("float8_e5m2", 8), "F8_E8M0": ("float8_e8m0fnu", 8),
    "I64": ("int64", 64), "I32": ("int32", 32), "I16": ("int16", 16), "I8": ("int8", 8),
    "U64": ("uint64", 64), "U32": ("uint32", 32), "U16": ("uint16", 16), "U8": ("uint8", 8), "BOOL": ("bool", 8),
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class CheckpointTensors:
    """Every tensor of a folder's safetensors files: key -> (shape, torch dtype name)."""

    tensors: dict[str, tuple[tuple[int, ...], str]]
    nbytes: dict[str, int]  # key -> bytes of its data
    files: tuple[str, ...]

    @property
    def total_bytes(self) -> int:
        return sum(self.nbytes.values())


def read_header(path: Path) -> dict[str, tuple[tuple[int, ...], str, int]]:
    """key -> (shape, torch dtype name, data bytes) of one safetensors file; reads the header only."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise InputError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (length,) = struct.unpack("<Q", head)
            if not 2 <= length <= _MAX_HEADER_BYTES:
                raise InputError(f"{path}: header length {length} is not a safetensors header (2..{_MAX_HEADER_BYTES})")
            raw = f.read(length)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.__class__.__name__}: {str(exc)[:200]})") from None
    if len(raw) != length:
        raise InputError(f"{path}: the file ends inside its {length}-byte header")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError(f"{path}: the safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: the safetensors header is not an object")
    out: dict[str, tuple[tuple[int, ...], str, int]] = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise InputError(f"{path}: tensor {key[:80]!r} has no dtype/shape entry")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in _DTYPES:
            raise InputError(f"{path}: tensor {key[:80]!r} has dtype {str(dtype)[:20]!r}, not a safetensors dtype")
        if (
            not isinstance(shape, list)
            or len(shape) > 8
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape)
        ):
            raise InputError(f"{path}: tensor {key[:80]!r} has shape {str(shape)[:60]}, not a tensor shape")
        name, bits = _DTYPES[dtype]
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * bits // 8
        if (
            not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or offsets[1] - offsets[0] != nbytes
        ):  # fmt: skip
            raise InputError(
                f"{path}: tensor {key[:80]!r}: data_offsets {str(offsets)[:60]} do not hold {nbytes} bytes"
            )
        out[key] = (tuple(shape), name, nbytes)
    return out


def read_checkpoint(folder: Path) -> CheckpointTensors | None:
    """The tensors of every ``*.safetensors`` in ``folder``; None when it holds none; InputError
    for a pickle-only checkpoint or a key stored twice with different contents."""
    files = sorted(folder.glob("*.safetensors"))[: _MAX_FILES + 1]
    if len(files) > _MAX_FILES:
        raise InputError(f"{folder}: more than {_MAX_FILES} safetensors files")
    if not files:
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        if pickles:
            raise InputError(
                f"{folder}: the weights are pickles ({', '.join(pickles[:3])}); memwarden does not unpickle model "
                "files (a pickle can run code). Convert them to safetensors, or estimate from config.json alone"
            )
        return None
    tensors: dict[str, tuple[tuple[int, ...], str]] = {}
    nbytes: dict[str, int] = {}
    for path in files:
        for key, (shape, dtype, size) in read_header(path).items():
            if key in tensors and tensors[key] != (shape, dtype):
                raise InputError(f"{folder}: tensor {key[:80]!r} is stored twice with different shapes or dtypes")
            tensors[key] = (shape, dtype)  # a key in two shards (a duplicate) is held once
            nbytes[key] = size
    return CheckpointTensors(tensors=tensors, nbytes=nbytes, files=tuple(p.name for p in files))
