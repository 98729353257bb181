"""The stress worker's fitted budget follows what the process holds beside the session, request by
request (resilience/worker.py ``refit_budget``): memory the process takes outside the session lowers
the session's budget by as much, another app's pages (the jitter's shared memory, already taken at
their largest) do not, and memory given back raises it again. Real memory, real session."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import mmap, sys
    from memwarden.models import zoo
    from memwarden.resilience.serving import make_server
    from memwarden.resilience.worker import _Injected, fit_budget, refit_budget, resident_bytes

    MiB = 2**20
    counts = sys.argv[1]

    def touched_anon(nbytes):
        block = bytearray(nbytes)  # one mmap'd block: private anonymous memory
        for i in range(0, nbytes, 4096):
            block[i] = 1
        return block

    def touched_shared(nbytes):
        chunk = mmap.mmap(-1, nbytes)  # as the jitter maps another app's pages: shared anonymous memory
        for i in range(0, nbytes, 4096):
            chunk[i] = 1
        return chunk

    model = zoo.build_model("llava", size="tiny")
    injected = _Injected({"inject": ["jitter:size=64MiB,period=15ms"]})  # the spec only: never started
    limit = resident_bytes("self", counts) + 512 * MiB
    fit = fit_budget(model, injected, limit, counts)
    assert fit["budget_bytes"] == limit - fit["other_bytes"] - 64 * MiB - fit["margin_bytes"]
    server = make_server("governed", model, budget_bytes=fit["budget_bytes"], options={"stream": False},
                         gen_kwargs=zoo.generate_kwargs("llava"))
    memory = server.session.memory
    fit = refit_budget(fit, server, injected)
    base = fit["budget_bytes"]
    assert memory.budget_bytes == base

    taken = touched_anon(96 * MiB)  # the process grows beside the session
    fit = refit_budget(fit, server, injected)
    assert base - 104 * MiB <= fit["budget_bytes"] <= base - 88 * MiB, (base, fit)
    assert memory.budget_bytes == fit["budget_bytes"] and fit["refits"] >= 1

    other_app = touched_shared(96 * MiB)  # another app's pages: counted once, at their largest
    before = fit["budget_bytes"]
    fit = refit_budget(fit, server, injected)
    assert abs(fit["budget_bytes"] - before) <= 4 * MiB, (before, fit)
    other_app.close()

    del taken  # given back: the budget comes back up
    fit = refit_budget(fit, server, injected)
    assert abs(fit["budget_bytes"] - base) <= 8 * MiB, (base, fit)

    injected.fraction = 0.5  # a squeeze in force scales the new budget and stays temporary
    taken = touched_anon(64 * MiB)
    fit = refit_budget(fit, server, injected)
    assert memory.budget_bytes == int(fit["budget_bytes"] * 0.5) and memory.budget_lowered, (fit, memory.budget_bytes)
    server.session.close()
    print("ok")
    """
)


@pytest.mark.parametrize("counts", ["footprint", "resident"])
def test_the_fitted_budget_follows_the_process_beside_the_session(counts: str) -> None:
    """In a fresh process, so that what earlier tests left in this one cannot move the first fit."""
    done = subprocess.run([sys.executable, "-c", SCRIPT, counts], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
