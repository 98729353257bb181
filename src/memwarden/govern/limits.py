"""The memory limits this process really runs under: its cgroup (v2 or v1) and ``RLIMIT_AS``.

Host-wide figures (``/proc/meminfo``, psutil) say nothing of a container: inside a 450 MiB
cgroup the host may still show 24 GB available, and a session sized from that is OOM-killed. Under
``prlimit --as`` every mapping counts against the limit, and native code that cannot map aborts
(OpenBLAS: "Memory allocation still failed") instead of raising. So telemetry and a session's budget
read the limits first:

- cgroup v2: ``memory.max`` and ``memory.high`` (the lower one binds; ancestors' limits apply too),
  ``memory.current`` less the reclaimable ``inactive_file`` of ``memory.stat``;
- cgroup v1: ``memory.limit_in_bytes`` and ``memory.soft_limit_in_bytes``, ``memory.usage_in_bytes``
  less ``total_inactive_file``;
- ``RLIMIT_AS`` (soft) less the address space already mapped (``VmSize``).

Every path is a parameter, so tests point them at fixture files. Torch-free; never raises for a
missing or unreadable file (that limit is then unknown).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_UNLIMITED = 1 << 62  # v1 writes "no limit" as 2**63 rounded down to a page: anything above this is none


@dataclass(frozen=True, kw_only=True)
class MemoryLimits:
    """What bounds this process's memory, each None where there is no such limit or it is unknown."""

    cgroup_max_bytes: int | None = None
    cgroup_high_bytes: int | None = None
    cgroup_used_bytes: int | None = None  # current usage less reclaimable page cache
    address_space_limit_bytes: int | None = None  # RLIMIT_AS, soft
    address_space_used_bytes: int | None = None  # VmSize

    @property
    def limit_bytes(self) -> int | None:
        """The lowest limit on this process's memory (cgroup max/high, address space), or None."""
        limits = [b for b in (self.cgroup_max_bytes, self.cgroup_high_bytes, self.address_space_limit_bytes) if b]
        return min(limits) if limits else None

    @property
    def available_bytes(self) -> int | None:
        """How much more this process may allocate before a limit binds, or None where none is known."""
        room = []
        cgroup = [b for b in (self.cgroup_max_bytes, self.cgroup_high_bytes) if b]
        if cgroup:
            room.append(min(cgroup) - (self.cgroup_used_bytes or 0))
        if self.address_space_limit_bytes:
            room.append(self.address_space_limit_bytes - (self.address_space_used_bytes or 0))
        return max(0, min(room)) if room else None


def _read_int(path: Path) -> int | None:
    """A limit file's value: None for "max", a missing file, or garbage; capped at 2**62."""
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    if not text.isdigit() or len(text) > 20:
        return None
    value = int(text)
    return None if value >= _UNLIMITED else value


def _stat_field(path: Path, key: str) -> int:
    try:
        with path.open(encoding="ascii", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key and value.strip().isdigit():
                    return int(value.strip())
    except OSError:
        pass
    return 0


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def read_cgroup(directory: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> MemoryLimits:
    """Limits of the cgroup at ``directory`` (v2 or v1 file names), and of its ancestors up to ``root``
    (default: ``directory`` alone)."""
    leaf = Path(directory)
    top = Path(root) if root is not None else leaf
    v2 = (leaf / "memory.current").exists() or (leaf / "memory.max").exists()
    names = ("memory.max", "memory.high") if v2 else ("memory.limit_in_bytes", "memory.soft_limit_in_bytes")
    high_or_soft: int | None = None
    hard: int | None = None
    node = leaf
    while True:
        hard = _min(hard, _read_int(node / names[0]))
        high_or_soft = _min(high_or_soft, _read_int(node / names[1]))
        if node == top or node.parent == node or top not in node.parents:
            break
        node = node.parent
    if v2:
        current = _read_int(leaf / "memory.current")
        reclaimable = _stat_field(leaf / "memory.stat", "inactive_file")
    else:
        current = _read_int(leaf / "memory.usage_in_bytes")
        reclaimable = _stat_field(leaf / "memory.stat", "total_inactive_file")
    used = None if current is None else max(0, current - reclaimable)
    return MemoryLimits(cgroup_max_bytes=hard, cgroup_high_bytes=high_or_soft, cgroup_used_bytes=used)


def own_cgroup_dir(
    proc_cgroup: str | os.PathLike[str] = "/proc/self/cgroup", mount: str | os.PathLike[str] = "/sys/fs/cgroup"
) -> tuple[Path, Path] | None:
    """(this process's memory cgroup directory, the hierarchy's root) from ``proc_cgroup``, or None."""
    base = Path(mount)
    try:
        lines = Path(proc_cgroup).read_text(encoding="ascii", errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:  # v1: "4:memory:/path" has its own mount; v2: "0::/path"
        parts = line.split(":", 2)
        if len(parts) == 3 and "memory" in parts[1].split(","):
            root = base / "memory"
            return root / parts[2].lstrip("/"), root
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "":
            for root in (base, base / "unified"):
                leaf = root / parts[2].lstrip("/")
                if (leaf / "memory.current").exists() or (root / "memory.current").exists():
                    return (leaf if leaf.exists() else root), root
    return None


def read_address_space(status: str | os.PathLike[str] = "/proc/self/status") -> MemoryLimits:
    """``RLIMIT_AS`` (soft) and the address space mapped now (``VmSize``)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return MemoryLimits()
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft <= 0 or soft >= _UNLIMITED:
        return MemoryLimits()
    used = 0
    try:
        with Path(status).open(encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmSize:"):  # "VmSize:\t  123456 kB"
                    used = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        used = 0
    return MemoryLimits(address_space_limit_bytes=int(soft), address_space_used_bytes=used or None)


def read_limits(
    *,
    cgroup_dir: str | os.PathLike[str] | None = None,
    cgroup_root: str | os.PathLike[str] | None = None,
    proc_cgroup: str | os.PathLike[str] = "/proc/self/cgroup",
    cgroup_mount: str | os.PathLike[str] = "/sys/fs/cgroup",
    status: str | os.PathLike[str] = "/proc/self/status",
) -> MemoryLimits:
    """This process's limits: its cgroup (``cgroup_dir``, or found through ``proc_cgroup`` under
    ``cgroup_mount``) and its address-space limit."""
    if cgroup_dir is None:
        found = own_cgroup_dir(proc_cgroup, cgroup_mount)
        cg = read_cgroup(found[0], root=found[1]) if found is not None else MemoryLimits()
    else:
        cg = read_cgroup(cgroup_dir, root=cgroup_root)
    aspace = read_address_space(status)
    return MemoryLimits(
        cgroup_max_bytes=cg.cgroup_max_bytes,
        cgroup_high_bytes=cg.cgroup_high_bytes,
        cgroup_used_bytes=cg.cgroup_used_bytes,
        address_space_limit_bytes=aspace.address_space_limit_bytes,
        address_space_used_bytes=aspace.address_space_used_bytes,
    )


def _meminfo(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with path.open(encoding="ascii", errors="replace") as f:
            for line in f:
                name, _, rest = line.partition(":")
                fields = rest.split()
                if name in ("MemTotal", "MemAvailable") and fields and fields[0].isdigit():
                    out[name] = int(fields[0]) * 1024
    except OSError:
        pass
    return out


class LimitsSource:
    """Telemetry source: memory as this process's limits allow it (its cgroup, ``RLIMIT_AS``), no more
    than the host's ``MemAvailable``. ``detect_sources`` adds it only where the process has a memory
    limit; elsewhere the host figures (psutil) apply as they are."""

    name = "limits"

    def __init__(self, *, meminfo: str | os.PathLike[str] = "/proc/meminfo", **paths: str | os.PathLike[str]) -> None:
        self._paths = paths  # read_limits' keywords (cgroup_dir, cgroup_root, proc_cgroup, cgroup_mount, status)
        self._meminfo = Path(meminfo)

    def read(self) -> dict[str, float]:
        limits = read_limits(**self._paths)
        host = _meminfo(self._meminfo)
        total = _min(limits.limit_bytes, host.get("MemTotal"))
        available = _min(limits.available_bytes, host.get("MemAvailable"))
        out: dict[str, float] = {}
        if total is not None:
            out["mem_total_bytes"] = float(total)
        if available is not None:
            out["mem_available_bytes"] = float(min(available, total) if total is not None else available)
        return out

    def close(self) -> None:
        pass


__all__ = ["LimitsSource", "MemoryLimits", "own_cgroup_dir", "read_address_space", "read_cgroup", "read_limits"]
