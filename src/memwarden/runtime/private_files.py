"""Files memwarden writes into a folder and later reads back, replaces or deletes.

A cache or offload folder is a place other processes (and other users, where it is shared) can
write. What is written there is only ever trusted, replaced or deleted when it is the writer's own:

- created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600: a symlink or a file planted at the
  name is refused, never written through (``create_new``); a replacement goes to such a new temp
  file first and is renamed over the name, which replaces the name itself, never a symlink's target
  (``replace_with``);
- read back with ``O_NOFOLLOW | O_NONBLOCK`` and checked with ``fstat`` on the open descriptor: a
  regular file within a byte budget, never a FIFO (which would block), a device (``/dev/zero``
  never ends) or a symlink (``read_own``);
- verified with a keyed digest (``mac``: BLAKE2b keyed with a secret only the writer holds), so a
  file forged, swapped or truncated behind the writer's back is refused, never used as data. The
  key lives in process memory (offload files) or in a 0600 file of the folder that this user
  created (``folder_key``: the feature cache's entries outlive the process).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from memwarden.errors import InputError

__all__ = [
    "KEY_BYTES",
    "NotOurs",
    "create_new",
    "folder_key",
    "mac",
    "mac_ok",
    "open_own",
    "read_own",
    "replace_with",
    "stream_mac",
]

KEY_BYTES = 32
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
_READ = os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC


class NotOurs(Exception):
    """A file that is not one this writer made: a symlink, FIFO, device, over the size budget."""


def create_new(path: Path, mode: int = 0o600) -> int:
    """A descriptor of ``path``, a new empty file (``FileExistsError`` if anything is at the name,
    a dangling symlink included)."""
    return os.open(path, _NEW, mode)


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _write_new(path: Path, data: bytes) -> None:
    fd = create_new(path)
    try:
        write_all(fd, data)
    except BaseException:
        os.close(fd)
        os.unlink(path)  # ours: just created
        raise
    os.close(fd)


def replace_with(path: Path, data: bytes) -> None:
    """``path`` now holds ``data``: written to a new temp file beside it (``.<name>.<token>.partial``,
    0600), then renamed over the name. Raises ``OSError``; the temp file never stays behind."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.partial")
    _write_new(tmp, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def open_own(path: Path, identity: tuple[int, int, int]) -> int:
    """A read-only descriptor of ``path`` if it is still the regular file this process created:
    ``identity`` is its ``(st_dev, st_ino, st_size)`` then. ``NotOurs`` otherwise (a symlink, a
    file put in its place, one grown or truncated since)."""
    try:
        fd = os.open(path, _READ)
    except FileNotFoundError:
        raise NotOurs("removed") from None
    except OSError as exc:
        raise NotOurs(f"cannot open ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino, st.st_size) != identity:
        os.close(fd)
        raise NotOurs("not the file written (replaced, or its size changed)")
    return fd


def read_own(path: Path, max_bytes: int, *, head: int | None = None) -> bytes:
    """The bytes of ``path`` (its first ``head`` bytes if given) if it is a regular file, not a
    symlink, of at most ``max_bytes``; ``NotOurs`` otherwise. ``FileNotFoundError`` passes through,
    other ``OSError`` too."""
    try:
        fd = os.open(path, _READ)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise NotOurs(f"cannot open ({exc.strerror})") from None  # ELOOP: a symlink
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotOurs("not a regular file")
        if st.st_size > max_bytes:
            raise NotOurs(f"{st.st_size} bytes, over the {max_bytes}-byte budget")
        limit = max_bytes if head is None else min(max_bytes, head)
        extra = 1 if head is None else 0  # a byte past the budget: the file grew while read
        chunks, total = [], 0
        while total < limit + extra:
            chunk = os.read(fd, min(1 << 20, limit + extra - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise NotOurs(f"over the {max_bytes}-byte budget")
        return b"".join(chunks)
    finally:
        os.close(fd)


def mac(key: bytes, *parts: bytes | memoryview, digest_size: int = 32) -> bytes:
    """Keyed BLAKE2b of the parts, in order (a MAC: without ``key`` nobody can compute it)."""
    h = hashlib.blake2b(key=key, digest_size=digest_size)
    for part in parts:
        h.update(part)
    return h.digest()


def stream_mac(key: bytes) -> hmac.HMAC:
    """An HMAC-SHA256 to feed large buffers (OpenSSL's: fast, and it releases the GIL while hashing)."""
    return hmac.new(key, digestmod="sha256")


def mac_ok(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)


def folder_key(directory: Path, name: str) -> bytes:
    """The folder's secret key, in ``directory/name``: created (random, 0600) if absent. A key file
    that is not a regular 0600 file of this user, or not ``KEY_BYTES`` long, is refused with
    ``InputError``: someone else could know it."""
    path = directory / name
    for _ in range(3):
        try:
            return _read_key(path)
        except FileNotFoundError:
            pass
        key = secrets.token_bytes(KEY_BYTES)
        tmp = directory / f".{name}.{secrets.token_hex(8)}.partial"
        _write_new(tmp, key)
        try:
            os.link(tmp, path)  # all at once: no other process reads half a key
        except FileExistsError:
            pass  # another process made it first: read theirs
        except OSError:  # a file system without hard links: create it in place
            try:
                _write_new(path, key)
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    try:
        fd = os.open(path, _READ)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise InputError(f"{path}: cannot open the cache key ({exc.strerror}); remove it to start afresh") from None
    try:
        st = os.fstat(fd)
        mine = getattr(os, "geteuid", lambda: st.st_uid)() == st.st_uid
        if not stat.S_ISREG(st.st_mode) or not mine or st.st_mode & 0o077 or st.st_size != KEY_BYTES:
            raise InputError(
                f"{path}: the cache key is not a {KEY_BYTES}-byte 0600 file of this user; "
                "another user could know it, so the folder's entries cannot be trusted (remove it to start afresh)"
            )
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise InputError(f"{path}: the cache key changed while read")
    return key
