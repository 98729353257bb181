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
