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
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memwarden.errors import InputError
from memwarden.untrusted import terminal_safe

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_TENSORS",
    "MAX_TOTAL_TENSORS",
    "CheckpointTensors",
    "read_checkpoint",
    "read_header",
]

MAX_HEADER_BYTES = 16 * 1024**2  # per file; safetensors' own limit is 100 MB, real headers are KiB
MAX_TENSORS = 100_000  # per file
MAX_TOTAL_TENSORS = 300_000  # per folder
_MAX_FILES = 4096
# safetensors dtype -> (torch dtype name, bits per element)
_DTYPES = {
    "F64": ("float64", 64),
    "F32": ("float32", 32),
    "F16": ("float16", 16),
    "BF16": ("bfloat16", 16),
    "F8_E4M3": ("float8_e4m3fn", 8),
    "F8_E5M2": ("float8_e5m2", 8),
    "F8_E8M0": ("float8_e8m0fnu", 8),
    "I64": ("int64", 64),
    "I32": ("int32", 32),
    "I16": ("int16", 16),
    "I8": ("int8", 8),
    "U64": ("uint64", 64),
    "U32": ("uint32", 32),
    "U16": ("uint16", 16),
    "U8": ("uint8", 8),
    "BOOL": ("bool", 8),
}


@dataclass(frozen=True, kw_only=True)
class CheckpointTensors:
    """Every tensor of a folder's safetensors files: key -> (shape, torch dtype name)."""

    tensors: dict[str, tuple[tuple[int, ...], str]]
    nbytes: dict[str, int]  # key -> bytes of its data
    files: tuple[str, ...]

    @property
    def total_bytes(self) -> int:
        return sum(self.nbytes.values())


def _open_regular(path: Path) -> tuple[int, int]:
    """(descriptor, size) of ``path`` opened without blocking; a FIFO, device or directory refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{_shown(path)}: cannot open ({exc.strerror or type(exc).__name__})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputError(
            f"{_shown(path)}: not a regular file (a FIFO, device or directory); expected a safetensors file"
        )
    return fd, int(st.st_size)


def _shown(text: object, limit: int = 200) -> str:
    return terminal_safe(text)[:limit]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key[:80]!r} appears twice")
        out[key] = value
    return out


def read_header(path: Path) -> dict[str, tuple[tuple[int, ...], str, int]]:
    """key -> (shape, torch dtype name, data bytes) of one safetensors file; reads the header only.

    Checked before anything is sized by it (``docs/security.md``): a regular file, a header of at
    most ``MAX_HEADER_BYTES`` holding at most ``MAX_TENSORS`` tensors, every dtype known, every
    shape of non-negative integers, every ``data_offsets`` pair exactly dtype x shape bytes, inside
    the file's data region and overlapping no other tensor."""
    fd, file_size = _open_regular(path)
    try:
        with os.fdopen(fd, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise InputError(f"{_shown(path)}: not a safetensors file (shorter than its 8-byte header length)")
            (length,) = struct.unpack("<Q", head)
            if not 2 <= length <= MAX_HEADER_BYTES:
                raise InputError(
                    f"{_shown(path)}: header length {length} is not a safetensors header this reader takes "
                    f"(2..{MAX_HEADER_BYTES} bytes)"
                )
            if 8 + length > file_size:
                raise InputError(f"{_shown(path)}: the file ends inside its {length}-byte header")
            raw = f.read(length)
    except OSError as exc:
        raise InputError(f"{_shown(path)}: cannot read ({exc.__class__.__name__}: {_shown(exc)})") from None
    if len(raw) != length:
        raise InputError(f"{_shown(path)}: the file ends inside its {length}-byte header")
    if raw.count(b'"data_offsets"') > MAX_TENSORS:
        raise InputError(f"{_shown(path)}: more than {MAX_TENSORS} tensors in one file")
    try:
        header = json.loads(raw, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"{_shown(path)}: the safetensors header is not JSON ({_shown(exc, 120)})") from None
    if not isinstance(header, dict):
        raise InputError(f"{_shown(path)}: the safetensors header is not an object")
    if len(header) > MAX_TENSORS + 1:
        raise InputError(f"{_shown(path)}: more than {MAX_TENSORS} tensors in one file")
    data_len = file_size - 8 - length
    out: dict[str, tuple[tuple[int, ...], str, int]] = {}
    spans: list[tuple[int, int, str]] = []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        name = _shown(key, 80)
        if not isinstance(info, dict):
            raise InputError(f"{_shown(path)}: tensor {name!r} has no dtype/shape entry")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in _DTYPES:
            raise InputError(
                f"{_shown(path)}: tensor {name!r} has dtype {_shown(dtype, 20)!r}, not a safetensors dtype"
            )
        if (
            not isinstance(shape, list)
            or len(shape) > 8
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape)
        ):
            raise InputError(f"{_shown(path)}: tensor {name!r} has shape {_shown(shape, 60)}, not a tensor shape")
        torch_name, bits = _DTYPES[dtype]
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * bits // 8
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
            or offsets[1] - offsets[0] != nbytes
        ):
            raise InputError(
                f"{_shown(path)}: tensor {name!r}: data_offsets {_shown(offsets, 60)} do not hold its {nbytes} bytes "
                f"({dtype} x {shape})"
            )
        if offsets[1] > data_len:
            raise InputError(
                f"{_shown(path)}: tensor {name!r}: data_offsets {offsets} reach past the end of the file's "
                f"{data_len}-byte data region"
            )
        spans.append((offsets[0], offsets[1], name))
        out[key] = (tuple(shape), torch_name, nbytes)
    spans.sort()
    reach, owner = 0, ""
    for start, end, name in spans:
        if start < reach and end > start:
            raise InputError(f"{_shown(path)}: tensors {owner!r} and {name!r} overlap in the data region")
        if end > reach:
            reach, owner = end, name
    return out


def read_checkpoint(folder: Path) -> CheckpointTensors | None:
    """The tensors of every ``*.safetensors`` in ``folder``; None when it holds none; InputError
    for a pickle-only checkpoint or a key stored twice with different contents."""
    files = sorted(folder.glob("*.safetensors"))[: _MAX_FILES + 1]
    if len(files) > _MAX_FILES:
        raise InputError(f"{_shown(folder)}: more than {_MAX_FILES} safetensors files")
    if not files:
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        if pickles:
            raise InputError(
                f"{_shown(folder)}: the weights are pickles ({_shown(', '.join(pickles[:3]))}); memwarden does not unpickle model "
                "files (a pickle can run code). Convert them to safetensors, or estimate from config.json alone"
            )
        return None
    tensors: dict[str, tuple[tuple[int, ...], str]] = {}
    nbytes: dict[str, int] = {}
    for path in files:
        for key, (shape, dtype, size) in read_header(path).items():
            if key in tensors and tensors[key] != (shape, dtype):
                raise InputError(
                    f"{_shown(folder)}: tensor {_shown(key, 80)!r} is stored twice with different shapes or dtypes"
                )
            if len(tensors) >= MAX_TOTAL_TENSORS:
                raise InputError(f"{_shown(folder)}: more than {MAX_TOTAL_TENSORS} tensors in the checkpoint")
            tensors[key] = (shape, dtype)  # a key in two shards (a duplicate) is held once
            nbytes[key] = size
    return CheckpointTensors(tensors=tensors, nbytes=nbytes, files=tuple(p.name for p in files))
