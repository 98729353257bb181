"""One case's forked child: ``memwarden.cli.main`` once per command, one record per run."""

from __future__ import annotations

import io
import json
import os
import resource
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any


def _hwm_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_hwm() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _child(runs: list[list[str]], workdir: Path, wfd: int, mem_cap: int) -> None:
    import traceback

    from memwarden.cli import main

    os.setpgid(0, 0)
    os.chdir(workdir)
    if mem_cap:
        resource.setrlimit(resource.RLIMIT_AS, (mem_cap, mem_cap))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    # the real descriptors, whatever the parent had put in sys.stdout (pytest's capture, say)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    for i, argv in enumerate(runs):
        out = os.open(f"out{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err = os.open(f"err{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        os.write(wfd, f"S {i}\n".encode())
        _reset_hwm()
        rec: dict[str, Any] = {"i": i}
        begin, cpu_begin = time.perf_counter(), _cpu_s()
        try:
            rec["rc"] = main(argv)
        except SystemExit as exc:
            rec["rc"] = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except BaseException as exc:  # noqa: BLE001 - the finding
            rec["exc"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            rec["where"] = traceback.format_exc()[-1200:]
        rec["s"] = round(time.perf_counter() - begin, 3)
        rec["cpu_s"] = round(_cpu_s() - cpu_begin, 3)  # apart from the wall time: the machine may be shared
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        rec["rss"] = _hwm_bytes()
        stderr = Path(f"err{i}").read_bytes()[:200_000]
        # `trace` runs the file it is given as Python, by design: that script's own traceback, followed
        # by memwarden's one line saying it failed, is the user's error reported, not memwarden's.
        script_failed = argv[:1] == ["trace"] and b" failed (exit status " in stderr
        if b"Traceback (most recent call last)" in stderr and not script_failed:
            rec["stderr_tb"] = stderr.decode("utf-8", "replace")[-1200:]
        printed = Path(f"out{i}").read_bytes()
        # --json in the list, but usage or the version printed: --json was not in force
        if (
            rec.get("rc") == 0
            and "--json" in argv
            and "exc" not in rec
            and not printed.startswith((b"usage:", b"memwarden "))
        ):
            try:
                json.loads(printed, parse_constant=_bad_constant)
            except (ValueError, UnicodeDecodeError) as exc:
                rec["bad_json"] = str(exc)[:120]
        os.write(wfd, ("R " + json.dumps(rec) + "\n").encode())
    os._exit(0)


def _bad_constant(name: str) -> Any:
    raise ValueError(f"printed {name}")


def _cpu_s() -> float:
    """CPU seconds of this process and the children it waited for."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds a live process has used so far (``/proc/PID/stat`` utime + stime)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def run_case(runs: list[list[str]], workdir: Path, timeout_s: float, mem_cap: int) -> list[dict[str, Any]]:
    """Fork, run every argv of ``runs`` in the child, and collect one record per run."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(rfd)
        try:
            _child(runs, workdir, wfd, mem_cap)
        finally:
            os._exit(3)
    os.close(wfd)
    records: dict[int, dict[str, Any]] = {}
    started: dict[int, float] = {}
    current = -1
    buf = b""
    reader = os.fdopen(rfd, "rb", buffering=0)
    killed = False
    while True:
        wait = timeout_s - (time.monotonic() - started[current]) if current >= 0 else timeout_s
        ready, _, _ = select.select([reader], [], [], max(wait, 0.0))
        if not ready:
            if current >= 0 and current not in records:
                # what this run used of the CPU (the child's total less the runs before it): a run the
                # wall clock stopped while the shared machine gave it little CPU is told apart
                before = sum(float(r.get("cpu_s", 0)) for r in records.values())
                cpu = round(_proc_cpu_s(pid) - before, 3)
                records[current] = {"i": current, "timeout": True, "s": timeout_s, "cpu_s": cpu}
            with _quiet():
                os.killpg(pid, signal.SIGKILL)
            killed = True
            break
        chunk = reader.read(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.startswith(b"S "):
                current = int(line[2:])
                started[current] = time.monotonic()
            elif line.startswith(b"R "):
                rec = json.loads(line[2:])
                records[rec["i"]] = rec
    reader.close()
    _, status = os.waitpid(pid, 0)
    with _quiet():
        os.killpg(pid, signal.SIGKILL)  # anything the run left behind (workers of stress, sweep)
    if not killed and (os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0):
        for i in range(len(runs)):
            if i not in records and i == current:
                records[i] = {"i": i, "crash": f"child ended with status {status}"}
    return [records[i] for i in sorted(records)]


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], ProcessLookupError | PermissionError)  # type: ignore[arg-type]
