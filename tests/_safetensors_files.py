"""safetensors files for the estimate tests: a header and a sparse data region of the right size
(holes that take no disk space and read as zeros): the estimate reads headers only, and checks that
every tensor's bytes lie inside the file."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

ST_DTYPES = {
    "float16": "F16",
    "bfloat16": "BF16",
    "float32": "F32",
    "int32": "I32",
    "int8": "I8",
    "uint8": "U8",
    "float8_e4m3fn": "F8_E4M3",
    "int64": "I64",
}
DTYPE_BYTES = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "int32": 4,
    "int8": 1,
    "uint8": 1,
    "float8_e4m3fn": 1,
    "int64": 8,
}


def write_header_only(path: Path, tensors: dict[str, tuple[tuple[int, ...], str]]) -> int:
    """Write the header (8-byte length + JSON) of a file holding ``tensors`` (name -> (shape, torch
    dtype name)) and a hole as its data region; returns the bytes the tensors hold."""
    header: dict[str, Any] = {}
    offset = 0
    for key, (shape, dtype) in tensors.items():
        n = math.prod(shape) * DTYPE_BYTES[dtype]
        header[key] = {"dtype": ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)  # a hole: no data is written
    return offset
