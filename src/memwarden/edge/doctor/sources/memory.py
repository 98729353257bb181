"""Memory as the kernel and the cgroup see it: host total, available, swap, and the limit.

A container's limit is what the OOM killer enforces, yet ``/proc/meminfo`` (and psutil) report
the host's memory; a budget planned against the host total overcommits the container.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memwarden.edge.doctor.sources._read import read_int, read_text

_UNLIMITED_BYTES = 1 << 60  # cgroup v1 writes "no limit" as a page-aligned near-2**63 number


def _meminfo() -> dict[str, int]:
    raw = read_text("/proc/meminfo") or ""
    out: dict[str, int] = {}
    for line in raw.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[key] = int(fields[0]) * (1024 if len(fields) > 1 and fields[1] == "kB" else 1)
    return out


def _cgroup() -> dict[str, Any]:
    own = read_text("/proc/self/cgroup") or ""
    for line in own.splitlines():
        if line.startswith("0::"):  # cgroup v2: one unified hierarchy
            path = line[3:].strip().lstrip("/")
            raw = read_text(Path("/sys/fs/cgroup") / path / "memory.max") or read_text("/sys/fs/cgroup/memory.max")
            if raw is not None:
                value = raw.strip()
                return {"version": 2, "limit_bytes": None if value == "max" else int(value)}
    limit = read_int("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    if limit is not None:
        return {"version": 1, "limit_bytes": None if limit >= _UNLIMITED_BYTES else limit}
    return {"version": None, "limit_bytes": None}


def collect() -> dict[str, Any]:
    info = _meminfo()
    if not info:
        return {"status": "not present"}
    return {
        "status": "present",
        "total_bytes": info.get("MemTotal"),
        "available_bytes": info.get("MemAvailable"),
        "swap_total_bytes": info.get("SwapTotal"),
        "swap_free_bytes": info.get("SwapFree"),
        "cgroup": _cgroup(),
    }
