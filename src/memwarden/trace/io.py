"""Trace files: ``save`` and ``load`` for ``.mwtrace``, and ``atomic_write``, the one way
memwarden writes any output file.

Every output (trace, snapshot, Chrome JSON, HTML report, heatmap, campaign records) goes
through ``atomic_write``: a temp file beside the target, then a rename over it, so a crash or
error mid-write leaves the old file or none, never a half-written one that looks complete;
the new file gets the mode any new file gets under the process umask (``mkstemp`` alone makes
0600). ``-`` means standard output; a symlink is written through to its target.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

from memwarden.errors import InputError
from memwarden.trace.format import dumps, loads
from memwarden.trace.model import Trace, TraceFormatError

__all__ = ["STDOUT", "atomic_write", "check_output", "load", "save"]


STDOUT = "-"  # as an output path: write to standard output, as Unix tools do


def check_output(path: str | os.PathLike[str], *, flag: str = "-o", allow_stdout: bool = True) -> None:
    """Refuse, before any work is done, an output path that ``atomic_write`` could not replace
    with a regular file: a directory, a device, a FIFO or socket (also behind a symlink), or a
    missing folder. ``-`` (stdout) passes where the output can stream."""
    text = os.fspath(path)
    if text == STDOUT:
        if not allow_stdout:
            raise InputError(f"{flag} -: this output cannot go to stdout; give a file name")
        return
    if not text:
        raise InputError(f"{flag}: empty file name")
    target = Path(text)
    try:
        st = target.stat()  # follows a symlink: what matters is what would be replaced
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise InputError(f"{flag} {text}: cannot write ({exc.strerror or exc.__class__.__name__})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (device, FIFO or socket)"
        raise InputError(f"{flag} {text}: is {kind}; give a file name")
    folder = _resolve(target).parent
    if not folder.is_dir():
        raise InputError(f"{flag} {text}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{flag} {text}: folder {folder} is not writable")


def atomic_write(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a temp file beside ``path``, then rename over it.

    A symlink at ``path`` is written through: its target is replaced, the link stays. ``-``
    writes to standard output. Anything but a regular file at ``path`` (a directory, device,
    FIFO) is refused with ``InputError``; commands call ``check_output`` first so the refusal
    comes before any work.
    """
    if os.fspath(path) == STDOUT:
        sys.stdout.flush()
        binary = getattr(sys.stdout, "buffer", None)
        if binary is None:  # stdout replaced by a text stream (a caller capturing output)
            sys.stdout.write(data.decode("utf-8", "replace"))
        else:
            binary.write(data)
            binary.flush()
        return Path(STDOUT)
    check_output(path, flag="output")
    path = _resolve(Path(path))
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


def _resolve(path: Path) -> Path:
    """The file a write to ``path`` lands in: a symlink's (possibly dangling) target, else ``path``."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


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
