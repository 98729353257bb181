"""Builds the malloc-level byte counter (``mallocpeak.cpp``) that ``measure`` preloads.

The counter is a small shared library that wraps the C library's allocation functions; it is
compiled once per source hash with the system C++ compiler into the cache folder
(``$MEMWARDEN_CACHE`` or ``~/.cache/memwarden``) and only ever loaded, with ``LD_PRELOAD``, into the
measurement subprocess, never into the caller's process. It needs Linux with glibc; elsewhere
``build`` returns None and the measurement reports no malloc figure.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

__all__ = ["ENV", "build", "read_live", "read_peak", "reset_peak"]

_SOURCE = Path(__file__).with_name("mallocpeak.cpp")
_FLAGS = ["-O2", "-shared", "-fPIC", "-fvisibility=hidden"]
ENV = "MEMWARDEN_MALLOCPEAK"  # set in the subprocess to the library's path, so it can check it is loaded


@lru_cache(maxsize=1)
def build() -> Path | None:
    """The compiled counter's path, building it on first use; None where it cannot be built here."""
    if not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None:
        return None
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        return None
    digest = hashlib.sha256(_SOURCE.read_bytes() + " ".join(_FLAGS).encode()).hexdigest()[:12]
    root = Path(os.environ.get("MEMWARDEN_CACHE", Path.home() / ".cache" / "memwarden"))
    target = root / "mallocpeak" / f"libmallocpeak-{digest}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    done = subprocess.run(
        [compiler, *_FLAGS, "-o", str(partial), str(_SOURCE)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        return None
    os.replace(partial, target)  # atomic: a concurrent build never sees half a library
    return target


def _lib() -> ctypes.CDLL:
    """The counter in this process (it must have been preloaded)."""
    lib = ctypes.CDLL(None)
    for name in ("memwarden_mallocpeak_live", "memwarden_mallocpeak_peak", "memwarden_mallocpeak_reset"):
        getattr(lib, name).restype = ctypes.c_int64
    return lib


def reset_peak() -> int:
    """Start a new peak at the bytes live now; returns them."""
    return int(_lib().memwarden_mallocpeak_reset())


def read_peak() -> int:
    """The highest live bytes since the last ``reset_peak``."""
    return int(_lib().memwarden_mallocpeak_peak())


def read_live() -> int:
    return int(_lib().memwarden_mallocpeak_live())
