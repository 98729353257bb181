"""The weight streamer's group files (``runtime/offload.py``): written once, read back many times,
deleted on ``detach``, and only ever the streamer's own.

- ``write_group`` creates ``<group>.safetensors`` with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (0600); where
  anything is already at that name (a planted symlink, a file, a FIFO) it takes another name,
  ``<group>.<token>.safetensors``: nothing is ever written through a link or into a file the
  streamer did not make. It records the file's device, inode and size and an HMAC-SHA256 of the
  tensor bytes, keyed with a secret the streamer holds in memory only.
- ``read_group`` reads only that file (not a symlink, same inode, same size). When the inode's
  modification and change times are still those of the write, nothing has touched it through the
  file system and the read is used as is; otherwise the HMAC of what it copied is checked before
  anything uses it: a file modified, truncated or swapped behind the streamer's back raises
  ``OffloadFileChanged`` instead of feeding the model other weights. (Checking the HMAC on every
  read made streaming about 3x slower; the change time cannot be set back by a user.)
- ``delete_group`` removes the name only while it still holds the inode written.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memwarden.errors import MemwardenError
from memwarden.runtime.private_files import NotOurs, create_new, mac_ok, open_own, stream_mac, write_all

__all__ = ["GroupFile", "OffloadFileChanged", "delete_group", "read_group", "write_group"]


class OffloadFileChanged(MemwardenError):
    """A streamed group's file is not as the streamer wrote it (replaced, truncated, modified)."""


@dataclass(frozen=True)
class GroupFile:
    path: Path
    extents: dict[str, tuple[int, int]]  # tensor name -> (begin, end) in the file, in file order
    identity: tuple[int, int, int]  # (st_dev, st_ino, st_size) as written
    digest: bytes  # HMAC-SHA256 of the tensor bytes in file order
    # (st_mtime_ns, st_ctime_ns) once written: every write, truncate, chmod or utime through the file
    # system moves the inode's change time, which no user can set back, so a file whose stamp is
    # unchanged holds the bytes written and its digest need not be recomputed on every read
    stamp: tuple[int, int] = (-1, -1)


def write_group(directory: Path, stem: str, tensors: dict[str, torch.Tensor], key: bytes) -> GroupFile:
    """A safetensors file of ``tensors`` (CPU) in ``directory``, written from the tensors' own memory:
    safetensors' ``save_file`` serializes the whole group into one bytes object first, a transient copy
    that a process streaming its weights because memory is short may not have room for."""
    from memwarden.runtime.lora.tensors import SAFETENSORS_DTYPES

    path, fd = _create(directory, stem)
    try:
        header: dict[str, Any] = {"__metadata__": {"memwarden": "offload"}}
        flat: list[tuple[str, torch.Tensor, int, int]] = []
        offset = 0
        for name, t in tensors.items():
            t = t if t.is_contiguous() else t.contiguous()  # weights are; a strided one is copied alone
            nbytes = t.numel() * t.element_size()
            shape, dtype = list(t.shape), SAFETENSORS_DTYPES[t.dtype]
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
            flat.append((name, t, offset, nbytes))
            offset += nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        write_all(fd, struct.pack("<Q", len(text)) + text)
        h = stream_mac(key)
        for _, t, _, nbytes in flat:
            if nbytes:
                view = memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr()))
                write_all(fd, view)
                h.update(view)
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        os.unlink(path)  # just created, by us
        raise
    os.close(fd)
    start = 8 + len(text)
    extents = {name: (start + begin, start + begin + nbytes) for name, _, begin, nbytes in flat}
    return GroupFile(
        path=path,
        extents=extents,
        identity=(st.st_dev, st.st_ino, st.st_size),
        digest=h.digest(),
        stamp=(st.st_mtime_ns, st.st_ctime_ns),
    )


def _create(directory: Path, stem: str) -> tuple[Path, int]:
    path = directory / f"{stem}.safetensors"
    for _ in range(8):
        try:
            return path, create_new(path)
        except FileExistsError:
            path = directory / f"{stem}.{secrets.token_hex(4)}.safetensors"
    return path, create_new(path)


def read_group(group: GroupFile, key: bytes, targets: list[tuple[int, int, int]], what: str) -> None:
    """Copy ``(address, file offset, nbytes)`` ranges of the group's file (all of its tensors, in file
    order) into memory, then check their HMAC; ``OffloadFileChanged`` if the file or the bytes are not
    those written (the memory then holds bytes nothing may use)."""
    try:
        fd = open_own(group.path, group.identity)
    except NotOurs as exc:
        raise OffloadFileChanged(f"{group.path}: the offload file of {what} is {exc}") from None
    try:
        st = os.fstat(fd)
        for address, offset, nbytes in targets:
            read_exactly(fd, address, offset, nbytes, group.path)
    finally:
        os.close(fd)
    if (st.st_mtime_ns, st.st_ctime_ns) == group.stamp:
        return  # untouched since written (see GroupFile.stamp): the bytes are the ones digested
    h = stream_mac(key)
    for address, _, nbytes in targets:
        if nbytes:
            h.update((ctypes.c_char * nbytes).from_address(address))
    if not mac_ok(h.digest(), group.digest):
        raise OffloadFileChanged(
            f"{group.path}: the offload file of {what} was modified after it was written "
            "(its keyed digest does not match); its weights are not used"
        )


def delete_group(group: GroupFile) -> None:
    """Remove the file if the name still holds the inode written (never a file put in its place)."""
    try:
        st = os.lstat(group.path)
        if (st.st_dev, st.st_ino) == group.identity[:2]:
            os.unlink(group.path)
    except OSError:
        pass


def read_exactly(fd: int, address: int, offset: int, nbytes: int, path: Path) -> None:
    """``nbytes`` of ``fd`` from ``offset`` into memory at ``address`` (``os.preadv`` releases the GIL)."""
    done = 0
    while done < nbytes:
        view = (ctypes.c_char * (nbytes - done)).from_address(address + done)
        n = os.preadv(fd, [view], offset + done)
        if n <= 0:
            raise OffloadFileChanged(
                f"{path}: the offload file ends early ({done} of {nbytes} bytes at offset {offset})"
            )
        done += n
