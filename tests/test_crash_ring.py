"""The crash ring (issue 41): every row the recorder logs is also copied into a file the traced
process maps, so ``memwarden trace`` loses nothing the process recorded when it dies between two
of the stream's flushes.

No test depends on timing: each script takes its streamer's lock before it allocates, so no flush
can write the allocation to the stream before the process dies, however long the death takes;
without the ring these traces hold none of it.
"""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import memwarden

MIB = 1 << 20
BIG = 32 * MIB

SCRIPT = textwrap.dedent(
    """
    import ctypes, os, signal, subprocess, sys
    import torch
    from memwarden.record.live import stream

    mode = sys.argv[1]
    if mode == "sibling":  # the killer waits for one byte on its stdin, then SIGKILLs this process
        killer = subprocess.Popen([sys.executable, "-c", "import os, signal, sys; sys.stdin.read(1); "
                                   f"os.kill({os.getpid()}, signal.SIGKILL)"], stdin=subprocess.PIPE)
    if mode != "none":  # the streamer's lock: no flush from here on, however long what follows takes
        stream._STREAMERS[0]._lock.acquire()
    big = torch.ones(32 << 20, dtype=torch.uint8)  # 32 MiB
    if mode == "segv":
        ctypes.string_at(0)
    elif mode == "abort":
        os.abort()
    elif mode == "exit":
        os._exit(7)
    elif mode == "sibling":
        killer.stdin.write(b"k")
        killer.stdin.flush()
        signal.pause()
    """
)


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("crash_ring") / "crash.py"
    path.write_text(SCRIPT)
    return path


def _trace(script: Path, tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess[str], memwarden.Trace]:
    out = tmp_path / "run.mwtrace"
    proc = subprocess.run(
        [sys.executable, "-m", "memwarden.cli", "trace", "-o", str(out), str(script), mode],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=300,
    )
    return proc, memwarden.load(out)


@pytest.mark.parametrize(
    ("mode", "signal_number", "status"),
    [
        ("segv", signal.SIGSEGV, 128 + signal.SIGSEGV),
        ("abort", signal.SIGABRT, 128 + signal.SIGABRT),
        ("sibling", signal.SIGKILL, 128 + signal.SIGKILL),
        ("exit", None, 7),
    ],
)
def test_the_last_allocation_survives_the_crash(
    script: Path, tmp_path: Path, mode: str, signal_number: int | None, status: int
) -> None:
    proc, trace = _trace(script, tmp_path, mode)
    assert proc.returncode == status, proc.stderr
    meta = trace.metadata
    assert meta["exit_signal"] == signal_number
    assert meta["lost_events"] == 0
    assert meta["recovered"]["ring_rows"] > 0
    assert memwarden.summary(trace).peak_bytes >= BIG


def test_a_clean_run_loses_nothing(script: Path, tmp_path: Path) -> None:
    proc, trace = _trace(script, tmp_path, "none")
    assert proc.returncode == 0, proc.stderr
    assert trace.metadata["lost_events"] == 0
    assert "recovered" not in trace.metadata
    assert memwarden.summary(trace).peak_bytes >= BIG


def _ring_file(path: Path, capacity: int, written: int) -> None:
    """A ring as native.cpp's ring_attach lays it out, rows ``0..written`` logged into it."""
    from memwarden.record.live.recover import RING_HEADER_BYTES, RING_MAGIC
    from memwarden.trace.stream import RAW_EVENT_DTYPE

    seqs = np.full(capacity, np.iinfo(np.uint64).max, dtype="<u8")
    rows = np.zeros(capacity, RAW_EVENT_DTYPE)
    for seq in range(max(0, written - capacity), written):
        slot = seq % capacity
        seqs[slot] = seq
        rows[slot] = (1000 + seq, 4096 * (seq + 1), MIB, seq + 1, -1, -1, -1, -1, 0, -1, 0, -1, -1)
    head = struct.pack("<8sIIQQQQQ", RING_MAGIC, 1, 64, capacity, 0, written, 0, 0)
    path.write_bytes(head.ljust(RING_HEADER_BYTES, b"\0") + seqs.tobytes() + rows.tobytes())


@pytest.mark.parametrize(("streamed", "written", "recovered", "lost"), [(3, 10, 7, 0), (3, 40, 16, 21), (10, 10, 0, 0)])
def test_recover_ring_takes_what_the_stream_lacks_and_counts_the_rest(
    tmp_path: Path, streamed: int, written: int, recovered: int, lost: int
) -> None:
    from memwarden.record.live.recover import recover_ring
    from memwarden.trace.stream import RAW_EVENT_DTYPE, StreamLog

    ring = tmp_path / "events.ring"
    _ring_file(ring, capacity=16, written=written)
    log = StreamLog(start={"ring": [0, 0, 16]}, rows=[np.zeros(streamed, RAW_EVENT_DTYPE)])
    got = recover_ring(log, ring)
    assert got is not None
    assert (got.recovered_rows, got.lost_events) == (recovered, lost)
    ids = log.raw_rows()["id"][streamed:]
    assert ids.tolist() == list(range(written - recovered + 1, written + 1))  # the newest, in order
    # the stream's own numbering after a flight-recorder cut: 2 live-state rows, then ring row 5 on
    log2 = StreamLog(start={"ring": [2, 5, 16]}, rows=[np.zeros(4, RAW_EVENT_DTYPE)])
    got2 = recover_ring(log2, ring)
    assert got2 is not None and got2.recovered_rows + got2.lost_events == max(0, written - 7)
