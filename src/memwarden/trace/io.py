"""Trace files: ``save`` and ``load`` for ``.mwtrace``, and ``atomic_write``, the one way
memwarden writes any output file.

Every output (trace, snapshot, Chrome JSON, HTML report, heatmap, campaign records) goes
through ``atomic_write``: a temp file beside the target, then a rename over it, so a crash or
error mid-write leaves the old file or none, never a half-written one that looks complete;
the new file gets the mode any new file gets under the process umask (``mkstemp`` alone makes
0600).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from memwarden.errors import InputError
from memwarden.trace.format import dumps, loads
from memwarden.trace.model import Trace, TraceFormatError

__all__ = ["atomic_write", "load", "save"]


def atomic_write(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a temp file beside ``path``, then rename over it."""
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


def save(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` to ``path`` as ``.mwtrace``, atomically."""
    return atomic_write(path, dumps(trace))


def load(path: str | os.PathLike[str]) -> Trace:
    """Read a ``.mwtrace`` file; ``TraceFormatError`` says what is wrong with a bad one.

    ``memwarden.load`` (``interop.files.load_any``) also reads PyTorch memory snapshots and
    turns every failure into one ``InputError`` naming the file.
    """
    with open(path, "rb") as fh:
        data = fh.read()
    return loads(data)


def load_mwtrace(path: Path) -> Trace:
    """``load``, with every way the file can be unusable as one ``InputError`` naming it."""
    try:
        return load(path)
    except TraceFormatError as exc:
        raise InputError(f"{path}: {exc}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError, MemoryError) as exc:
        # loads turns most corruption into TraceFormatError; a header with e.g. an infinite
        # number or absurd nesting can still surface as these.
        raise InputError(f"{path}: trace is corrupt ({exc.__class__.__name__})") from None
