"""The header of a GGUF file, read without touching its tensor data.

A GGUF is untrusted input (a model author wrote it): every count, length and offset is checked
against fixed caps and against the file's real size before anything is sized or looped by it, so a
damaged or hostile header is one ``InputError`` line, never a traceback, a hang or a huge
allocation. The file is memory-mapped read-only; only the header pages are touched.

Layout (ggml's ``gguf.cpp``, ``gguf_init_from_file_impl``): magic ``GGUF``, version (u32, 2 or 3),
tensor count (u64), metadata count (u64), the key/value pairs, the tensor infos (name, n_dims,
ne[n_dims], type, offset), padding to ``general.alignment`` (default 32), then the data.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

from memwarden.errors import InputError
from memwarden.untrusted import open_regular, terminal_safe

__all__ = ["GGUFHeader", "TensorInfo", "read_header", "type_name", "tensor_nbytes"]

# Caps far above every published model (DeepSeek-V3 in one file: ~1.2k tensors, a 262k-token
# vocabulary, chat templates of ~100 KB) and far below what would hurt.
MAX_TENSORS = 1 << 20
MAX_KV = 1 << 16
MAX_KEY_BYTES = 1 << 16
MAX_STRING_BYTES = 1 << 24
MAX_ARRAY_ITEMS = 1 << 25
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 50
KEPT_ARRAY_ITEMS = 4096  # numeric arrays longer than this keep their length only (token scores, merges)

# GGUF value types (gguf.cpp: GGUF_TYPE_*) -> struct code; 8 = string, 9 = array.
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ne[0..n_dims): ne[0] is the contiguous (row) dimension
    ggml_type: int
    offset: int  # bytes from the start of the data section
    nbytes: int  # ggml_nbytes: rows x ggml_row_size(type, ne[0])

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array too long (or of strings) to keep: its item type and length only."""

    item_type: int
    length: int


@dataclass(frozen=True)
class GGUFHeader:
    path: str
    version: int
    metadata: dict[str, Any]  # scalars, short numeric lists, ArrayInfo for the rest
    tensors: tuple[TensorInfo, ...]
    data_offset: int  # where the tensor data starts in the file (aligned)
    alignment: int
    file_bytes: int

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def data_bytes(self) -> int:
        """The tensor data as laid out in the file: from its first byte to the end of the last tensor."""
        return max((t.offset + t.nbytes for t in self.tensors), default=0)


def _quant_sizes() -> dict[int, tuple[int, int]]:
    """ggml type id -> (elements per block, bytes per block), from the gguf package's copy of
    ggml.c's ``type_traits`` (``GGML_QUANT_SIZES``)."""
    from gguf.constants import GGML_QUANT_SIZES

    return {int(k): (int(b), int(s)) for k, (b, s) in GGML_QUANT_SIZES.items()}


QUANT_SIZES = _quant_sizes()


def type_name(ggml_type: int) -> str:
    from gguf.constants import GGMLQuantizationType

    try:
        return str(GGMLQuantizationType(ggml_type).name)
    except ValueError:
        return f"type{ggml_type}"


def type_id(name: str) -> int:
    from gguf.constants import GGMLQuantizationType

    return int(GGMLQuantizationType[name.upper()])


def row_bytes(ggml_type: int, n_per_row: int) -> int:
    """ggml_row_size: bytes of one row of ``n_per_row`` elements (a whole number of blocks)."""
    block, size = QUANT_SIZES[ggml_type]
    return size * (n_per_row // block)


def tensor_nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    rows = 1
    for n in shape[1:]:
        rows *= n
    return row_bytes(ggml_type, shape[0] if shape else 1) * rows


class _Cursor:
    """Reads little-endian fields from the mapped header, every read checked against the end."""

    def __init__(self, buf: mmap.mmap | bytes, label: str) -> None:
        self.buf, self.pos, self.end, self.label = buf, 0, len(buf), label

    def fail(self, what: str) -> InputError:
        return InputError(f"{self.label}: not a valid GGUF header ({what} at byte {self.pos})")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise self.fail(f"truncated {what}")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return bytes(out)

    def unpack(self, code: str, what: str) -> Any:
        size = struct.calcsize(code)
        return struct.unpack(code, self.take(size, what))[0]

    def u64(self, what: str) -> int:
        return int(self.unpack("<Q", what))

    def string(self, cap: int, what: str) -> str:
        n = self.u64(f"{what} length")
        if n > cap:
            raise self.fail(f"{what} of {n} bytes (at most {cap})")
        return self.take(n, what).decode("utf-8", "replace")

    def _skip_strings(self, count: int, key: str) -> None:
        """Past ``count`` strings (a 262k-token vocabulary in ~0.1 s): one bounds check per item."""
        pos, end, buf, unpack_from = self.pos, self.end, self.buf, _U64.unpack_from
        for _ in range(count):
            if pos + 8 > end:
                break
            n = unpack_from(buf, pos)[0]
            pos += 8 + n
            if n > MAX_STRING_BYTES or pos > end:
                break
        else:
            self.pos = pos
            return
        self.pos = min(pos, end)
        raise self.fail(f"truncated string array {terminal_safe(key)!r}")

    def value(self, vtype: int, key: str, depth: int = 0) -> Any:
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype], key)
        if vtype == _STRING:
            return self.string(MAX_STRING_BYTES, key)
        if vtype != _ARRAY or depth > 0:  # llama.cpp's loader reads no nested arrays
            raise self.fail(f"value type {vtype} of {terminal_safe(key)!r}")
        item_type = int(self.unpack("<I", key))
        length = self.u64(f"{key} length")
        if length > MAX_ARRAY_ITEMS:
            raise self.fail(f"array {terminal_safe(key)!r} of {length} items (at most {MAX_ARRAY_ITEMS})")
        if item_type in _SCALAR:
            size = struct.calcsize(_SCALAR[item_type])
            if self.pos + size * length > self.end:
                raise self.fail(f"truncated array {terminal_safe(key)!r}")
            if length > KEPT_ARRAY_ITEMS:
                self.pos += size * length
                return ArrayInfo(item_type, length)
            raw = self.take(size * length, key)
            return list(struct.unpack("<" + _SCALAR[item_type][1] * length, raw))
        if item_type == _STRING:  # token texts, merges: kept as a count (each length still checked)
            self._skip_strings(length, key)
            return ArrayInfo(item_type, length)
        raise self.fail(f"array item type {item_type} of {terminal_safe(key)!r}")


def read_header(path: str | os.PathLike[str], label: str | None = None) -> GGUFHeader:
    """The header of the GGUF at ``path``; ``InputError`` (one line) for anything else."""
    label = terminal_safe(label or os.fspath(path))
    with open_regular(path, label, "a GGUF file") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 24:
            raise InputError(f"{label}: not a GGUF file ({size} bytes)")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return _parse(mapped, label, os.fspath(path), size)


def _parse(buf: mmap.mmap | bytes, label: str, path: str, size: int) -> GGUFHeader:
    cur = _Cursor(buf, label)
    if cur.take(4, "magic") != b"GGUF":
        raise InputError(f"{label}: not a GGUF file (no GGUF magic)")
    version = int(cur.unpack("<I", "version"))
    if version not in (2, 3):
        raise InputError(f"{label}: GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = cur.u64("tensor count"), cur.u64("metadata count")
    if n_tensors > MAX_TENSORS:
        raise cur.fail(f"{n_tensors} tensors (at most {MAX_TENSORS})")
    if n_kv > MAX_KV:
        raise cur.fail(f"{n_kv} metadata entries (at most {MAX_KV})")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string(MAX_KEY_BYTES, "metadata key")
        vtype = int(cur.unpack("<I", "value type"))
        if key in metadata:
            raise cur.fail(f"duplicate key {terminal_safe(key)!r}")
        metadata[key] = cur.value(vtype, key)
    tensors = [_tensor_info(cur) for _ in range(n_tensors)]
    alignment = metadata.get("general.alignment", 32)
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or not 1 <= alignment <= 1 << 16
        or (alignment & (alignment - 1))
    ):
        raise cur.fail(f"general.alignment {alignment!r} (a power of two up to 65536)")
    data_offset = -(-cur.pos // alignment) * alignment
    names: set[str] = set()
    for t in tensors:
        if t.name in names:
            raise InputError(f"{label}: not a valid GGUF header (duplicate tensor {terminal_safe(t.name)!r})")
        names.add(t.name)
        if t.offset % alignment:
            raise InputError(
                f"{label}: tensor {terminal_safe(t.name)!r} offset {t.offset} is not aligned to {alignment}"
            )
        if data_offset + t.offset + t.nbytes > size:  # llama.cpp: "tensor data is not within the file bounds"
            raise InputError(
                f"{label}: tensor {terminal_safe(t.name)!r} data ends past the end of the file "
                f"({data_offset + t.offset + t.nbytes} > {size} bytes; truncated?)"
            )
    return GGUFHeader(path, version, metadata, tuple(tensors), data_offset, alignment, size)


def _tensor_info(cur: _Cursor) -> TensorInfo:
    name = cur.string(64, "tensor name")  # GGML_MAX_NAME
    n_dims = int(cur.unpack("<I", "tensor n_dims"))
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(f"tensor {terminal_safe(name)!r} with {n_dims} dimensions")
    shape = tuple(cur.u64("tensor dimension") for _ in range(n_dims))
    elements = 1
    for n in shape:
        elements *= n
    if elements > MAX_ELEMENTS:
        raise cur.fail(f"tensor {terminal_safe(name)!r} of {elements} elements")
    ggml_type = int(cur.unpack("<I", "tensor type"))
    if ggml_type not in QUANT_SIZES:
        raise cur.fail(f"tensor {terminal_safe(name)!r} of unknown ggml type {ggml_type}")
    block = QUANT_SIZES[ggml_type][0]
    if shape[0] % block:
        raise cur.fail(
            f"tensor {terminal_safe(name)!r}: row of {shape[0]} is not a multiple of {type_name(ggml_type)}'s block {block}"
        )
    offset = cur.u64("tensor offset")
    return TensorInfo(name, shape, ggml_type, offset, tensor_nbytes(ggml_type, shape))
