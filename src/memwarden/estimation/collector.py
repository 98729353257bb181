"""Python's cyclic garbage collector during an estimate: paused while torch, transformers and the
family's modeling module import, and kept off the objects they made while the meta run works.

Why: a cold estimate imports torch, transformers and the family's modeling module (which brings
torch.distributed, sympy, torch._dynamo and scipy with it), some 4x10^5 objects that live as long
as the process: modules, classes, functions. The collector's full passes walk every one of them,
several times while they import and again during the meta run, for nothing: on a 2-core machine
they were ~3 s of the ~15 s of CPU of ``memwarden estimate qwen2-vl-7b-instruct --image 1280x720``
(benchmarks/bench_estimate_speed.py).

Why the estimate's figures do not change: the meta run's own objects are collected as before (the
young generations still run at their thresholds, and tensors die by reference count); only the
objects alive before the run starts are left out of its passes, and the run's tensors are not among
them. The pause holds no tensor of a run: nothing is recorded while the model's config resolves.

The collector is left as it was found, and nothing is frozen where the caller manages it
(switched off, or objects frozen already): a library caller's process is unchanged after an
estimate returns, apart from collections skipped while it ran.
"""

from __future__ import annotations

import gc
from types import TracebackType

__all__ = ["EstimateCollector"]


class EstimateCollector:
    """``with EstimateCollector() as c: <imports>; c.imports_done(); <meta runs>``.

    Inside, until :meth:`imports_done`, no automatic collection (imports make long-lived objects
    and few cycles to free). Then every object alive is frozen (``gc.freeze``) before the collector
    runs again: frozen first, so that the first collection after the pause does not walk the
    hundreds of thousands of objects the imports made. On exit they are unfrozen and the collector
    is as it was. Where the caller manages the collector (switched off, or objects frozen already)
    nothing is frozen."""

    def __init__(self) -> None:
        self._was_enabled = False
        self._paused = False
        self._froze = False

    def __enter__(self) -> EstimateCollector:
        self._was_enabled = gc.isenabled()
        if self._was_enabled:
            gc.disable()
            self._paused = True
        return self

    def imports_done(self) -> None:
        if not self._paused:
            return
        if not gc.get_freeze_count():
            gc.freeze()
            self._froze = True
        gc.enable()
        self._paused = False

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._froze:
            gc.unfreeze()
            self._froze = False
        if self._paused:
            gc.enable()
            self._paused = False
