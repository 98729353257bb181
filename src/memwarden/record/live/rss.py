"""Resident memory of a process, read from ``/proc`` (Linux): RSS always, PSS and the
anonymous/file split from ``smaps_rollup`` where the kernel has it and it is readable.

Every figure is in bytes; a sample is a dict ``{"t_ns", "rss", "pss", "anon", "file"}`` with the
figures that could be read (``t_ns`` on the monotonic clock, the recorder's clock). Used by the
streamer (the process samples itself) and by the supervisor (it samples the traced child).
"""

from __future__ import annotations

import os
import time

__all__ = ["sample"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_ROLLUP_KEYS = {"Rss:": "rss", "Pss:": "pss", "Anonymous:": "anon", "Pss_File:": "pss_file"}


_SELF: list[int] = [-1, -1]  # [pid, fd] of this process's own statm, kept open: one pread a sample


def _self_statm() -> bytes:
    pid = os.getpid()
    if _SELF[0] != pid:  # first use, or a forked child holding its parent's file
        _SELF[:] = [pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)]
    return os.pread(_SELF[1], 256, 0)


def _statm_rss(pid: int | str) -> int | None:
    try:
        if pid == "self":
            return int(_self_statm().split()[1]) * _PAGE
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _rollup(pid: int | str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in _ROLLUP_KEYS:
            try:
                out[_ROLLUP_KEYS[parts[0]]] = int(parts[1]) * 1024
            except ValueError:
                continue
    return out


def sample(pid: int | str = "self", *, detail: bool = True) -> dict[str, int] | None:
    """One sample of ``pid``'s resident memory, None if the process is gone or unreadable.
    ``file`` is the resident bytes not anonymous (mapped files, shared libraries)."""
    t_ns = time.monotonic_ns()
    rss = _statm_rss(pid)
    if rss is None:
        return None
    out = {"t_ns": t_ns, "rss": rss}
    if detail:
        rollup = _rollup(pid)
        if "pss" in rollup:
            out["pss"] = rollup["pss"]
        if "anon" in rollup:
            out["anon"] = rollup["anon"]
            out["file"] = max(0, rollup.get("rss", rss) - rollup["anon"])
    return out
