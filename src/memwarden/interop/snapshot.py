"""PyTorch memory snapshots: safe import into a Trace, export for PyTorch's viewer.

A snapshot (``torch.cuda.memory._snapshot()`` / ``_dump_snapshot``) is a pickle
of plain dicts and lists: ``segments`` (allocator state when it was taken),
``device_traces`` (one ring buffer of allocator events per CUDA device) and
``allocator_settings``. Field meanings follow torch/cuda/memory.py and
torch/csrc/cuda/memory_snapshot.cpp.

Safety. A pickle is a program: GLOBAL/STACK_GLOBAL/INST/EXT opcodes fetch any
callable by name and REDUCE/NEWOBJ/BUILD call it. Every route to a callable goes
through ``Unpickler.find_class`` (or ``persistent_load``), so the unpickler
below refuses both and no code from a file ever runs. What is left (dict, list,
tuple, str, bytes, int, float, bool, None) is then checked field by field
(``memwarden.interop.snapshot_import``).

This module is the file edge: ``load_snapshot`` reads and unpickles,
``save_snapshot`` pickles and writes. The conversions beside it are pure:
``memwarden.interop.snapshot_import`` turns the unpickled objects into a Trace,
``memwarden.interop.snapshot_export`` a Trace into a snapshot dict
(``to_snapshot``, ``device_indices``).
"""

from __future__ import annotations

import io
import os
import pickle
import struct
from pathlib import Path
from typing import Any

from memwarden.errors import InputError
from memwarden.interop.snapshot_export import to_snapshot
from memwarden.interop.snapshot_import import snapshot_to_trace
from memwarden.trace.io import atomic_write
from memwarden.trace.model import Trace

__all__ = ["DEFAULT_MAX_SNAPSHOT_BYTES", "load_snapshot", "save_snapshot"]

DEFAULT_MAX_SNAPSHOT_BYTES = 1 << 30  # 1 GiB: a 100k-entry ring buffer with C++ stacks is ~100s of MiB
PICKLE_PROTOCOL = 4  # MemoryViz.js refuses protocol 5


# -- restricted unpickling --------------------------------------------------------------


class _Refused(Exception):
    """Raised inside the unpickler the moment a pickle asks for anything callable."""


_MODULE_ALIASES = {"posix": "os", "nt": "os"}  # os.system pickles as posix.system: name what the user wrote


_PyUnpickler: Any = pickle._Unpickler  # the pure-Python implementation


class _NoGlobalsUnpickler(_PyUnpickler):
    """Python's own unpickler (``pickle._Unpickler``), not the C one: the C unpickler keeps its memo
    in an array it grows to twice the largest LONG_BINPUT index it meets and zero-fills, so a
    2 KB file with one ``LONG_BINPUT 208758119`` took 3.3 GB of resident memory before failing;
    here the memo is a dict. It is ~15x slower per opcode (a 200,000-entry, 14 MB snapshot: 2.2 s
    vs 0.1 s), the price of a loader whose memory is bounded by its input."""

    dispatch = dict(_PyUnpickler.dispatch)

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self._size = len(data)

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"{_MODULE_ALIASES.get(module, module)}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("an external object (persistent id)")

    def load_bytearray8(self) -> None:
        (size,) = struct.unpack("<Q", self.read(8))
        if size > self._size:  # bytearray(size) would be made (and zeroed) before the read finds the end
            raise pickle.UnpicklingError(f"BYTEARRAY8 of {size} bytes in a {self._size}-byte file")
        data = bytearray(size)
        self.readinto(data)
        self.append(data)

    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8


def _restricted_loads(data: bytes) -> Any:
    try:
        return _NoGlobalsUnpickler(data).load()
    except _Refused as exc:
        raise InputError(f"refused: pickle references {exc}; memwarden never runs code from a file") from None
    except MemoryError:
        raise InputError("not a readable pickle (it declares sizes larger than memory)") from None
    except Exception as exc:  # no code ran, so any failure means a truncated or corrupt stream
        raise InputError(f"not a readable pickle ({exc.__class__.__name__}: truncated or corrupt)") from None


def _read_source(source: str | os.PathLike[str] | bytes, max_bytes: int) -> tuple[str, bytes]:
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        label = "snapshot"
    else:
        label = str(source)
        try:
            with open(source, "rb") as fh:
                data = fh.read(max_bytes + 1)
        except FileNotFoundError:
            raise InputError(f"{label}: no such file") from None
        except IsADirectoryError:
            raise InputError(f"{label}: is a directory, not a snapshot") from None
        except OSError as exc:
            raise InputError(f"{label}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    if len(data) > max_bytes:
        raise InputError(f"{label}: snapshot is larger than the {max_bytes}-byte limit (raise max_bytes to read it)")
    return label, data


def load_snapshot(source: str | os.PathLike[str] | bytes, max_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES) -> Trace:
    """Read a PyTorch memory snapshot (path or bytes) into a Trace, running no code from it."""
    label, data = _read_source(source, max_bytes)
    try:
        return snapshot_to_trace(_restricted_loads(data), len(data))
    except InputError as exc:
        raise InputError(f"{label}: {exc}") from None


def save_snapshot(
    trace: Trace,
    path: str | os.PathLike[str],
    segments: list[dict[str, Any]] | None = None,
    **options: Any,
) -> Path:
    """Pickle ``to_snapshot(trace, segments, **options)`` atomically (protocol 4, plain types only)."""
    data = pickle.dumps(to_snapshot(trace, segments, **options), protocol=PICKLE_PROTOCOL)
    return atomic_write(path, data)
