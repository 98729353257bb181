"""Snapshot pickles whose memo makes a small file stand for a huge amount of work (issue 16): each is
one clear InputError within the file's work budget, never a gigabyte and minutes."""

from __future__ import annotations

import pickle
import time

import pytest

from memwarden.errors import InputError
from memwarden.interop.snapshot import load_snapshot


def _entry(k: int, frames: list) -> dict:
    return {"action": "alloc", "addr": 4096 * (k + 1), "size": 512, "stream": 0, "time_us": k, "frames": frames}


def _dup_bomb(copies: int) -> bytes:
    """One entry pushed ``copies`` times with DUP (one byte each) and appended to a device trace."""
    entry = pickle.dumps(_entry(0, [{"name": "f", "filename": "a.py", "line": 1}]), protocol=2)[2:-1]
    return (
        b"\x80\x02}(X\x08\x00\x00\x00segments]X\r\x00\x00\x00device_traces](]("
        + entry
        + b"2" * copies  # DUP
        + b"ee"  # APPENDS into the device trace, APPENDS it into device_traces
        + b"u."  # SETITEMS, STOP
    )


def test_a_dup_bomb_is_refused_by_its_work_not_its_size():
    data = _dup_bomb(1_000_000)
    assert len(data) < 1_100_000
    start = time.process_time()
    with pytest.raises(InputError, match="pickle bomb"):
        load_snapshot(data)
    assert time.process_time() - start < 20  # the unpickling itself; the import never starts


def test_frames_sharing_one_huge_string_are_refused():
    """Every entry's own frame list points 64 times at one frame whose file name is 256 KiB long: a
    438 KB file that asked for 100 G characters of string work."""
    frame = {"name": "<module>", "filename": "x" * (256 * 1024), "line": 1}
    snapshot = {"segments": [], "device_traces": [[_entry(k, [frame] * 64) for k in range(3000)]]}
    data = pickle.dumps(snapshot, protocol=4)
    assert len(data) < 1_000_000
    with pytest.raises(InputError, match="pickle bomb"):
        load_snapshot(data)


def test_the_same_entries_written_out_in_full_still_load():
    """The budget is proportional to the file: the same data without memo sharing is a normal snapshot."""
    snapshot = {
        "segments": [],
        "device_traces": [[_entry(k, [{"name": f"f{k}", "filename": f"m{k}.py", "line": 1}]) for k in range(2000)]],
    }
    trace = load_snapshot(pickle.dumps(snapshot, protocol=4))
    assert len(trace) == 2000


_PEAK_OF_LOADING = """
import resource, sys
from memwarden.errors import InputError
from memwarden.interop.snapshot import load_snapshot
data = bytes.fromhex(sys.argv[1])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    load_snapshot(data)
except InputError as exc:
    print(str(exc).splitlines()[0])
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


@pytest.mark.parametrize(
    "bomb",
    [
        # LONG_BINPUT 2^25: the C unpickler grows its memo array to 2^26 slots and zeroes them (512 MiB)
        b"\x80\x02}r" + (1 << 25).to_bytes(4, "little") + b"X\x08\x00\x00\x00segments]s.",
        # BYTEARRAY8 of 512 MiB in a 30-byte file: made and zeroed before the read finds the end
        b"\x80\x05\x96" + (1 << 29).to_bytes(8, "little") + b"abc.",
    ],
    ids=["long-binput-memo", "bytearray8"],
)
def test_a_tiny_file_cannot_make_the_unpickler_allocate_for_sizes_it_only_declares(bomb: bytes) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _PEAK_OF_LOADING, bomb.hex()], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    message, grown_mib = out.stdout.strip().splitlines()[-2:]
    assert "snapshot" in message  # one clear error (or a refusal further on), not a crash
    assert int(grown_mib) < 64, f"loading a {len(bomb)}-byte file took {grown_mib} MiB more"
