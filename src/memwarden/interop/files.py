"""``load_any``: read any trace file memwarden understands (this is ``memwarden.load``).

It sniffs the first bytes instead of trusting the file name: a ``.mwtrace`` starts with
``MWTRACE\\0``, a capture's stream left by a killed process starts with ``MWSTREAM`` (every
whole chunk is recovered; ``metadata["recovered"]`` says so), a PyTorch memory snapshot is a
pickle (protocol 2+ starts with 0x80). Every way a file can be unusable (missing, a directory,
empty, unreadable, corrupt, hostile) ends as one ``InputError`` naming the file, so the CLI
prints one line and no traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

from memwarden.errors import InputError
from memwarden.interop.snapshot import load_snapshot
from memwarden.trace.format import FORMAT_MAGIC
from memwarden.trace.io import load_mwtrace
from memwarden.trace.model import Trace
from memwarden.trace.stream import STREAM_MAGIC, read_stream, trace_from_stream

__all__ = ["load_any"]

_PICKLE_PROTO = 0x80
_EXPECTED = "a memwarden trace (.mwtrace) or a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot pickle)"


def load_any(path: str | os.PathLike[str]) -> Trace:
    """Load a ``.mwtrace`` or a PyTorch memory snapshot; raise ``InputError`` for anything else."""
    path = Path(path)
    try:
        if path.is_dir():
            raise InputError(f"{path}: is a directory; expected {_EXPECTED}")
        if path.exists() and not path.is_file():  # a FIFO would block the open for ever, a device never end
            raise InputError(f"{path}: not a regular file (a FIFO, device or socket); expected {_EXPECTED}")
        with open(path, "rb") as fh:
            head = fh.read(len(FORMAT_MAGIC))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; expected {_EXPECTED}") from None
    except OSError as exc:
        raise InputError(
            f"{path}: cannot read ({exc.strerror or exc.__class__.__name__}); expected {_EXPECTED}"
        ) from None
    if not head:
        raise InputError(f"{path}: file is empty; expected {_EXPECTED}")
    if head == FORMAT_MAGIC:
        return load_mwtrace(path)
    if head == STREAM_MAGIC:
        return _load_stream(path)
    if head[0] == _PICKLE_PROTO:
        return load_snapshot(path)
    raise InputError(f"{path}: unknown file type (starts with {head!r}); expected {_EXPECTED}")


def _load_stream(path: Path) -> Trace:
    """A stream whose writer died (and whose supervisor, if any, too): every whole chunk."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    try:
        return trace_from_stream(read_stream(data))
    except (ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:
        raise InputError(f"{path}: capture stream is corrupt ({exc})") from None
