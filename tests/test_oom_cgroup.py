"""issue 41: under a real cgroup memory limit, the OOM kill ``memwarden trace`` reports is one.

The test makes a child of its own memory cgroup (v2 ``memory.max``, or v1
``memory.limit_in_bytes``), moves a shell into it and ``exec``s the real CLI, whose script grows
until the kernel kills it. It skips where no cgroup can be made (not root, a read-only
``/sys/fs/cgroup``, a v2 parent that cannot delegate the memory controller). No timing: the
script grows until the kernel stops it, however long that takes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import memwarden

LIMIT_BYTES = 1 << 30  # torch's import (~300 MiB) and the supervisor fit; the growth does not

GROW = textwrap.dedent(
    """
    import torch
    import memwarden

    kept = []
    while True:  # 32 MiB a step, each written (resident), flushed so the trace holds the growth
        kept.append(torch.ones(32 << 20, dtype=torch.uint8))
        memwarden.flush()
    """
)


def _own_memory_cgroup() -> tuple[Path, str] | None:
    """(this process's memory cgroup directory, "v1" or "v2"), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "v1"
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0":
            for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                controllers_file = root / path.lstrip("/") / "cgroup.controllers"
                if controllers_file.exists() and "memory" in controllers_file.read_text().split():
                    return controllers_file.parent, "v2"
    return None


def _swap_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("SwapTotal:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.fixture
def limited_cgroup() -> Iterator[Path]:
    found = _own_memory_cgroup()
    if found is None:
        pytest.skip("no memory cgroup controller here")
    parent, version = found
    child = parent / f"memwarden-test-{os.getpid()}"
    try:
        child.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup under {parent}: {exc}")
    try:
        try:
            if version == "v2":
                (child / "memory.max").write_text(str(LIMIT_BYTES))
                if (child / "memory.swap.max").exists():
                    (child / "memory.swap.max").write_text("0")
            else:
                (child / "memory.limit_in_bytes").write_text(str(LIMIT_BYTES))
                if (child / "memory.memsw.limit_in_bytes").exists():  # no swapping out of the limit
                    (child / "memory.memsw.limit_in_bytes").write_text(str(LIMIT_BYTES))
                elif _swap_bytes() > 0:
                    pytest.skip("swap without a cgroup swap limit: the script would swap, not be killed")
        except OSError as exc:
            pytest.skip(f"cannot set a memory limit on {child}: {exc}")
        yield child
    finally:
        for _ in range(3):
            try:
                child.rmdir()  # only once its processes are gone (they are, after the test)
                break
            except OSError:
                subprocess.run(["sleep", "0.2"], check=False)


def test_an_oom_kill_under_a_cgroup_limit_is_named(limited_cgroup: Path, tmp_path: Path) -> None:
    script, out = tmp_path / "grow.py", tmp_path / "grow.mwtrace"
    script.write_text(GROW)
    procs = limited_cgroup / "cgroup.procs"
    cli = " ".join(f"'{a}'" for a in (sys.executable, "-m", "memwarden.cli", "trace", "-o", str(out), str(script)))
    proc = subprocess.run(
        ["sh", "-c", f"echo $$ > '{procs}' && exec {cli}"],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    meta = memwarden.load(out).metadata
    assert meta["exit_signal"] == signal.SIGKILL
    assert meta["oom_killed"] is True, (meta.get("oom_evidence"), proc.stderr)
    assert meta["oom_evidence"] in ("kernel log", "cgroup oom_kill counter")
    assert "died of memory" in proc.stderr and "OOM killer" in proc.stderr, proc.stderr
    assert memwarden.summary(memwarden.load(out)).peak_bytes >= 5 * (32 << 20)
