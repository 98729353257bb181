"""Reading any trace file memwarden understands, and writing files atomically.

``load_any`` sniffs the first bytes instead of trusting the file name: a
``.mwtrace`` starts with ``MWTRACE\\0``, a PyTorch memory snapshot is a pickle
(protocol 2+ starts with 0x80). Every way a file can be unusable (missing, a
directory, empty, unreadable, corrupt, hostile) ends as one ``InputError``
naming the file, so the CLI prints one line and no traceback.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from memwarden.errors import InputError
from memwarden.trace import model
from memwarden.trace.model import Trace, TraceFormatError

__all__ = ["atomic_write", "load_any"]

_PICKLE_PROTO = 0x80
_EXPECTED = "a memwarden trace (.mwtrace) or a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot pickle)"


def atomic_write(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a temp file beside ``path``, then rename over it.

    A crash or error mid-write leaves either the old file or none, never a
    half-written one that looks complete.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode any new file gets
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def load_any(path: str | os.PathLike[str]) -> Trace:
    """Load a ``.mwtrace`` or a PyTorch memory snapshot; raise ``InputError`` for anything else."""
    path = Path(path)
    try:
        if path.is_dir():
            raise InputError(f"{path}: is a directory; expected {_EXPECTED}")
        with open(path, "rb") as fh:
            head = fh.read(len(model.FORMAT_MAGIC))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; expected {_EXPECTED}") from None
    except OSError as exc:
        raise InputError(
            f"{path}: cannot read ({exc.strerror or exc.__class__.__name__}); expected {_EXPECTED}"
        ) from None
    if not head:
        raise InputError(f"{path}: file is empty; expected {_EXPECTED}")
    if head == model.FORMAT_MAGIC:
        return _load_mwtrace(path)
    if head[0] == _PICKLE_PROTO:
        from memwarden.trace.snapshot import load_snapshot  # lazy: snapshot imports this module

        return load_snapshot(path)
    raise InputError(f"{path}: unknown file type (starts with {head!r}); expected {_EXPECTED}")


def _load_mwtrace(path: Path) -> Trace:
    try:
        return model.load(path)
    except TraceFormatError as exc:
        raise InputError(f"{path}: {exc}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError, MemoryError) as exc:
        # model.loads turns most corruption into TraceFormatError; a header with
        # e.g. an infinite number or absurd nesting can still surface as these.
        raise InputError(f"{path}: trace is corrupt ({exc.__class__.__name__})") from None
