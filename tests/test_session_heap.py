"""GovernedSession's heap hygiene on CPU: freed activations leave the resident set.

glibc raises its mmap threshold after a large mapped block is freed; later tensors of that size
then come from the heap, and a small block allocated above one keeps the freed pages resident.
The session fixes the threshold (process-wide), so each case runs in a fresh interpreter.

Where each tensor came from is read from glibc's own books (``mallinfo2``: bytes in mapped
blocks), which is deterministic; how much a heap-served fragment keeps resident is not (it depends
on the holes earlier imports left, which can take the small blocks), so the control asserts the
mechanism and the session asserts both the mechanism and the resident set.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc/self/status")

_FRAGMENT = """
import ctypes, sys, torch
class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks', 'uordblks', 'fordblks', 'keepcost')]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2
def mapped():
    return libc.mallinfo2().hblkhd
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS'):
            return int(line.split()[1]) * 1024
if sys.argv[1] == 'session':
    from memwarden.models import zoo
    from memwarden.runtime.session import GovernedSession
    GovernedSession(zoo.build_model('llava', 'tiny'), budget='256MiB')
big = torch.ones(6 * 2**20); del big      # a 24 MiB mapped block, freed: the dynamic threshold rises to 24 MiB
base = rss(); keep = []; served_by_mmap = 0
for i in range(8):
    before = mapped()
    t = torch.ones((2 + i // 2) * 2**20 + i)  # 8-20 MiB of activations, each larger than the last hole
    served_by_mmap += mapped() - before >= t.numel() * 4
    keep.append(torch.ones(16))            # a small tensor that outlives it
    del t
print(served_by_mmap, (rss() - base) // 2**20)
"""


def _run(mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", _FRAGMENT, mode], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    mapped, retained = out.stdout.strip().splitlines()[-1].split()
    return int(mapped), int(retained)


def test_session_keeps_freed_activations_out_of_the_resident_set() -> None:
    off_mapped, _ = _run("plain")
    on_mapped, on_retained = _run("session")
    assert off_mapped == 0, f"plain torch should serve 8-20 MiB tensors from the heap here ({off_mapped}/8 mapped)"
    assert on_mapped == 8, f"with the session's fixed mmap threshold each tensor is mapped ({on_mapped}/8)"
    assert on_retained <= 8, (
        f"with the session's fixed mmap threshold freed tensors are unmapped (retained {on_retained} MiB)"
    )


_TRIM = """
import threading, time
from memwarden.runtime import host_memory

def anon():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("RssAnon:"))

def trimmed_after(before_trims):
    for _ in range(3000):  # waits for the trimmer thread's count, not for a time
        if host_memory._TRIMMER.trims > before_trims:
            return True
        time.sleep(0.01)
    return False

blocks = [bytearray(2048) for _ in range(60_000)]  # ~120 MiB of small blocks: glibc's heap, not mmap
for b in blocks[:-1:2]:
    b[0] = 1
keep = blocks[-1]
del blocks  # every block freed but the last: the heap's top is held, the freed pages stay resident
held = anon()
n = host_memory._TRIMMER.trims
host_memory.trim_soon()
assert trimmed_after(n), "the trimmer never ran"
assert host_memory._TRIMMER._thread is not None and host_memory._TRIMMER._thread is not threading.current_thread()
dropped = held - anon()
assert dropped > 64 * 2**20, (held, anon())

from memwarden.models import zoo
from memwarden.runtime.session import GovernedSession
model = zoo.build_model("llava", size="tiny")
session = GovernedSession(model, budget="1GiB")
n = host_memory._TRIMMER.trims
session.generate(**zoo.make_inputs(model, prompt_tokens=12), max_new_tokens=2, **zoo.generate_kwargs("llava"))
assert trimmed_after(n), "a request's end asked for no trim"
session.close()
print("ok", dropped)
"""


def test_freed_heap_pages_go_back_off_the_requests_path() -> None:
    """``trim_soon`` gives a fragmented heap's freed pages back from a thread of its own, and a
    session's request end asks for it (issue 17: a device's memory killer counts those pages)."""
    done = subprocess.run([sys.executable, "-c", _TRIM], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-3000:]
