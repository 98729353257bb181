"""GovernedSession's heap hygiene on CPU: freed activations leave the resident set.

glibc raises its mmap threshold after a large mapped block is freed; later tensors of that size
then come from the heap, and a small block allocated above one keeps the freed pages resident.
The session fixes the threshold (process-wide), so each case runs in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc/self/status")

_FRAGMENT = """
import sys, torch
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS'):
            return int(line.split()[1]) * 1024
if sys.argv[1] == 'session':
    from memwarden.models import zoo
    from memwarden.runtime.session import GovernedSession
    GovernedSession(zoo.build_model('llava', 'tiny'), budget='256MiB')
big = torch.ones(6 * 2**20); del big      # a 24 MiB mapped block, freed: the dynamic threshold rises to 24 MiB
base = rss(); keep = []
for i in range(8):
    t = torch.ones((2 + i // 2) * 2**20 + i)  # 8-20 MiB of activations, each larger than the last hole
    keep.append(torch.ones(16))            # a small tensor that outlives it
    del t
print((rss() - base) // 2**20)
"""


def _retained_mib(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _FRAGMENT, mode], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip().splitlines()[-1])


def test_session_keeps_freed_activations_out_of_the_resident_set() -> None:
    # The control runs the fragment in plain torch (a model build before it leaves heap holes that
    # make the control's pinning vary from run to run; the session's result does not depend on them).
    off, on = _retained_mib("plain"), _retained_mib("session")
    assert off >= 32, f"the fragment should pin freed 8-20 MiB tensors without the fix (retained {off} MiB)"
    assert on <= 8, f"with the session's fixed mmap threshold freed tensors are unmapped (retained {on} MiB)"
