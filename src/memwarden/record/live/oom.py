"""Was the traced child killed by the OOM killer? Only evidence answers yes.

A SIGKILL alone proves nothing: a hand ``kill -9``, a watchdog and the OOM killer all send it.
The supervisor asks, in order of how precisely each source names *this* child:

1. the kernel log (``/dev/kmsg``, readable by root outside most containers): the OOM killer
   writes ``Killed process PID`` for every victim, global or cgroup. The supervisor opens the
   log before the child starts and skips what was already there, so only this run's lines count
   and a recycled pid from before cannot match. Decisive either way, so it is read only in the
   kernel's own pid namespace (the log numbers pids as the kernel does; a container's differ).
2. the child's cgroup ``oom_kill`` counter (v2 ``memory.events``, also under a hybrid mount's
   ``/sys/fs/cgroup/unified``; v1 ``memory.oom_control``): an OOM kill in the cgroup the child
   runs in, the container's limit. Another process of the same cgroup killed in the same span
   would be counted too; the counter is still the container's own word.
3. ``/proc/vmstat``'s machine-wide ``oom_kill``: the weakest, used only without the others.

None where no source could be read: then the post-mortem says "likely" or nothing, never "died
of memory" as a fact.
"""

from __future__ import annotations

import errno
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KernelLog", "OomCounters", "oom_evidence", "oom_killed"]

_CGROUP_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


@dataclass
class OomCounters:
    """The kernel's count of OOM kills where this machine exposes one: the cgroup's
    ``memory.events`` (v2) or ``memory.oom_control`` (v1) ``oom_kill``, and ``/proc/vmstat``."""

    cgroup: int | None
    vmstat: int | None

    @staticmethod
    def _cgroup_files(pid: int | str) -> list[Path]:
        files: list[Path] = []
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return files
        for line in lines:
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            hierarchy, controllers, path = parts
            rel = path.lstrip("/")
            if hierarchy == "0" and controllers == "":
                files.extend(root / rel / "memory.events" for root in _CGROUP_ROOTS)
            elif "memory" in controllers.split(","):
                files.append(Path("/sys/fs/cgroup/memory") / rel / "memory.oom_control")
        return files

    @staticmethod
    def _counter(path: Path) -> int | None:
        try:
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            return None
        return None

    @classmethod
    def read(cls, pid: int | str = "self") -> OomCounters:
        cgroup = None
        for path in cls._cgroup_files(pid):
            cgroup = cls._counter(path)
            if cgroup is not None:
                break
        return cls(cgroup=cgroup, vmstat=cls._counter(Path("/proc/vmstat")))


_KILLED = re.compile(rb"Killed process (\d+)\b")
_MAX_RECORDS = 200_000  # a log flooded during the run is read this far, no further


def _root_pid_namespace() -> bool:
    """Whether this process's pids are the kernel's (``NSpid`` has one entry)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return len(line.split()) == 2
    except OSError:
        return False
    return True  # a kernel without NSpid (< 4.1) has no pid namespaces to worry about


class KernelLog:
    """This run's kernel log lines: ``open`` before the child starts, ``killed(pid)`` after."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def open(cls) -> KernelLog | None:
        if not _root_pid_namespace():
            return None
        try:
            fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            os.lseek(fd, 0, os.SEEK_END)  # skip what was logged before this run
        except OSError:
            os.close(fd)
            return None
        return cls(fd)

    def killed(self, pid: int) -> bool | None:
        """Whether the OOM killer named ``pid`` since ``open``; None if the log could not be read."""
        found = False
        try:
            for _ in range(_MAX_RECORDS):
                try:
                    record = os.read(self._fd, 8192)  # one record a read
                except OSError as exc:
                    if exc.errno == errno.EAGAIN:
                        break
                    if exc.errno == errno.EPIPE:  # records overwritten before read: keep going
                        continue
                    return None
                if not record:
                    break
                match = _KILLED.search(record)
                if match is not None and int(match.group(1)) == pid:
                    found = True
        finally:
            self.close()
        return found

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def oom_killed(
    before: OomCounters, after: OomCounters, exit_signal: int | None, kernel_log: bool | None = None
) -> bool | None:
    """True/False where the evidence tells, None where it cannot: the OOM killer sends SIGKILL,
    so any other end is False; a SIGKILL is an OOM kill when the kernel log named the child
    (``kernel_log``: decisive when it could be read), else when the child's cgroup counted one,
    else, without a cgroup counter, when the machine's count rose."""
    if exit_signal != signal.SIGKILL:
        return False
    if kernel_log is not None:
        return kernel_log
    if before.cgroup is not None and after.cgroup is not None:
        return after.cgroup > before.cgroup
    if before.vmstat is not None and after.vmstat is not None:
        return after.vmstat > before.vmstat
    return None


def oom_evidence(before: OomCounters, after: OomCounters, kernel_log: bool | None) -> str | None:
    """Which source ``oom_killed`` answered from (``metadata.oom_evidence``), None if none."""
    if kernel_log is not None:
        return "kernel log"
    if before.cgroup is not None and after.cgroup is not None:
        return "cgroup oom_kill counter"
    if before.vmstat is not None and after.vmstat is not None:
        return "machine oom_kill counter"
    return None
