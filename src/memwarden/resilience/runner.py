"""The parent side of a worker: spawn it under limits, talk to it, watch it, tell how it ended.

Imports no torch: a campaign process only starts children and reads pipes. Each child runs
``memwarden/resilience/worker.py`` with its job in the environment (see worker.py).

How a run ends, as the campaign counts it:

- ``ok``: the request was answered (or the script exited 0);
- ``oom``: a memory failure: the workload raised MemoryError / an allocator failure
  (answered as such, or exit ``EXIT_OOM``), or the child was killed by SIGKILL (the
  kernel's OOM killer, or our RSS watchdog playing lmkd/jetsam);
- ``crash``: any other exception, exit status or signal (SIGSEGV, SIGABRT);
- ``lost``: no answer: the request timed out (the child is killed), or the worker could not
  be (re)started any more.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memwarden.errors import InputError
from memwarden.resilience.worker import EXIT_OOM, JOB_ENV, resident_bytes

__all__ = ["ExitInfo", "Limits", "RunOutcome", "ServeWorker", "WorkerDied", "classify_exit", "run_limited"]

_POLL_S = 0.01  # the watchdog samples RSS this often: a 128 MiB jitter cycle takes ~0.1 s to fault in
_SRC_DIR = str(Path(__file__).resolve().parents[2])  # the folder holding the memwarden package
# The worker runs by path, not ``-m memwarden.resilience.worker``: importing it as a module would import the
# memwarden package first (~0.6 s of CPU), which a script workload without injections never needs.
_BOOT = f"import runpy; runpy.run_path({str(Path(__file__).with_name('worker.py'))!r}, run_name='__main__')"


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What a worker may use. None = unlimited."""

    address_space_bytes: int | None = None  # RLIMIT_AS in the child: the kernel refuses mappings past it
    rss_bytes: int | None = None  # parent watchdog: SIGKILL when the resident set passes it
    # What the watchdog counts: "resident" (every resident page) or "footprint" (anonymous and shared memory: as
    # iOS's phys_footprint, clean file pages — libraries, memory-mapped weights — are left out, since
    # the kernel drops them under pressure instead of killing anyone).
    rss_counts: str = "resident"
    gpu_bytes: int | None = None  # CUDA caching allocator cap (set_per_process_memory_fraction)
    request_timeout_s: float = 120.0
    start_timeout_s: float = 300.0  # python + torch import + model build under a tight limit

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True, kw_only=True)
class ExitInfo:
    returncode: int | None  # exit status, or None if killed by a signal
    signal: int | None
    peak_rss_bytes: int  # the child's lifetime peak (wait4's ru_maxrss)
    killed_by: str | None = None  # "watchdog" | "timeout" when we killed it
    stderr_tail: str = ""


def classify_exit(info: ExitInfo) -> str:
    if info.killed_by == "watchdog":
        return "oom"
    if info.killed_by == "timeout":
        return "lost"
    if info.signal == signal.SIGKILL:
        return "oom"  # nobody but the kernel's OOM killer sends SIGKILL to our child
    if info.returncode == 0:
        return "ok"
    if info.returncode == EXIT_OOM:
        return "oom"
    return "crash"


class WorkerDied(Exception):
    def __init__(self, info: ExitInfo) -> None:
        super().__init__(f"worker ended: {info}")
        self.info = info


def _tail(path: Path, limit_bytes: int = 2000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - limit_bytes))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


class _Child:
    """One spawned worker process with the watchdog and reaping that both kinds of run need."""

    def __init__(
        self,
        job: dict[str, Any],
        limits: Limits,
        log_path: Path,
        *,
        threads: int = 1,
        pass_fds: tuple[int, ...] = (),
        stdin: Any = subprocess.DEVNULL,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        env = dict(os.environ)
        env.update(extra_env or {})
        env[JOB_ENV] = json.dumps(job)
        # glibc gives each thread a 64 MiB malloc arena of address space; under RLIMIT_AS that
        # counts as used. Two arenas keep the address space close to what is really allocated.
        env["MALLOC_ARENA_MAX"] = "2"
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_SRC_DIR, env.get("PYTHONPATH", "")) if p)
        self.limits = limits
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT],
            stdin=stdin,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            pass_fds=pass_fds,
            env=env,
            start_new_session=True,
        )
        self.info: ExitInfo | None = None

    def poll(self) -> ExitInfo | None:
        """Reap if it ended; enforce the RSS watchdog. None while it runs."""
        if self.info is not None:
            return self.info
        pid, status, rusage = os.wait4(self.proc.pid, os.WNOHANG)
        if pid == 0:
            if (
                self.limits.rss_bytes is not None
                and resident_bytes(self.proc.pid, self.limits.rss_counts) > self.limits.rss_bytes
            ):
                return self.kill("watchdog")
            return None
        return self._reaped(status, rusage, None)

    def kill(self, reason: str) -> ExitInfo:
        if self.info is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: takes grandchildren along
            except ProcessLookupError:
                pass
            _, status, rusage = os.wait4(self.proc.pid, 0)
            self._reaped(status, rusage, reason)
        assert self.info is not None
        return self.info

    def _reaped(self, status: int, rusage: Any, killed_by: str | None) -> ExitInfo:
        code = os.waitstatus_to_exitcode(status)
        self.proc.returncode = code  # so Popen does not try to reap it again
        self._log.close()
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:  # a write the child never read: nothing to flush to
                pass
        self.info = ExitInfo(
            returncode=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            peak_rss_bytes=int(rusage.ru_maxrss) * 1024,
            killed_by=killed_by,
            stderr_tail=_tail(self.log_path),
        )
        return self.info


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    status: str  # ok | oom | crash | lost
    wall_s: float
    exit: ExitInfo


def run_limited(
    script: str | os.PathLike[str],
    *,
    args: list[str] | tuple[str, ...] = (),
    limits: Limits = Limits(),
    inject: list[str] | tuple[str, ...] = (),
    log_path: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> RunOutcome:
    """Run a Python script in a child under ``limits`` and ``inject`` specs; how it ended."""
    from memwarden.resilience.inject import parse_inject

    path = Path(script)
    if not path.is_file():
        raise InputError(f"{script}: no such script")
    for spec in inject:
        parse_inject(spec)  # one clear error here rather than a crashed child
    job = {
        "kind": "script",
        "script": str(path),
        "args": list(args),
        "limit_bytes": limits.address_space_bytes,
        "inject": list(inject),
    }
    if log_path is None:  # keep the output only for the tail of the outcome
        fd, tmp = tempfile.mkstemp(prefix="memwarden-run-", suffix=".log")
        os.close(fd)
    log = Path(log_path if log_path is not None else tmp)
    try:
        begin = time.monotonic()
        child = _Child(job, limits, log, extra_env=env)
        deadline = begin + (timeout_s if timeout_s is not None else limits.request_timeout_s)
        while (info := child.poll()) is None:
            if time.monotonic() > deadline:
                info = child.kill("timeout")
                break
            time.sleep(_POLL_S)
    finally:
        if log_path is None:
            os.unlink(tmp)
    return RunOutcome(status=classify_exit(info), wall_s=time.monotonic() - begin, exit=info)


class ServeWorker:
    """A long-lived serving child: built once, answers requests one at a time."""

    def __init__(self, job: dict[str, Any], limits: Limits, log_path: Path, threads: int = 1) -> None:
        self._read_fd, write_fd = os.pipe()
        job = {**job, "kind": "serve", "result_fd": write_fd}
        try:
            self.child = _Child(job, limits, log_path, threads=threads, pass_fds=(write_fd,), stdin=subprocess.PIPE)
        finally:
            os.close(write_fd)  # the child holds its own copy; EOF on ours means it is gone
        self.limits = limits
        self._buffer = b""
        self.load_s: float | None = None

    def start(self) -> ServeWorker:
        ready = self._read(self.limits.start_timeout_s)
        self.load_s = float(ready.get("load_s", 0.0))
        return self

    def request(self, index: int, seed: int) -> dict[str, Any]:
        assert self.child.proc.stdin is not None
        try:
            self.child.proc.stdin.write((json.dumps({"index": index, "seed": seed}) + "\n").encode())
            self.child.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied(self._wait_dead()) from None
        return self._read(self.limits.request_timeout_s)

    def _read(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            if time.monotonic() > deadline:
                raise WorkerDied(self.child.kill("timeout"))
            ready, _, _ = select.select([self._read_fd], [], [], _POLL_S)
            if ready:
                chunk = os.read(self._read_fd, 1 << 16)
                if not chunk:
                    raise WorkerDied(self._wait_dead())
                self._buffer += chunk
                continue
            if (info := self.child.poll()) is not None:
                raise WorkerDied(info)
        line, _, self._buffer = self._buffer.partition(b"\n")
        return dict(json.loads(line))

    def _wait_dead(self) -> ExitInfo:
        deadline = time.monotonic() + 10
        while (info := self.child.poll()) is None:
            if time.monotonic() > deadline:
                return self.child.kill("timeout")
            time.sleep(_POLL_S)
        return info

    def close(self) -> None:
        """Ask it to stop, then make sure: a worker never outlives its campaign."""
        if self.child.info is None:
            try:
                assert self.child.proc.stdin is not None
                self.child.proc.stdin.write(b'{"stop": true}\n')
                self.child.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            deadline = time.monotonic() + 5
            while self.child.poll() is None and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            self.child.kill("closed")
        try:
            os.close(self._read_fd)
        except OSError:
            pass
