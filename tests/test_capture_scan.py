"""The capture's start-up scan (native.cpp ``gc_instances``) finds exactly the tensors and modules
``gc.get_objects()`` holds, on the first walk of a process (no anchors yet) and on later walks
(many chains from anchors kept between walks), across collections, gc.freeze() and deletions."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from memwarden.record import native

SCRIPT = textwrap.dedent(
    """
    import gc, torch
    from memwarden.record import native
    from memwarden.record.live.capture import _all_subclasses

    rec = native.load()
    bases = (torch._C.TensorBase, torch.nn.Module)
    classes = _all_subclasses(bases[0]) | _all_subclasses(bases[1])

    def check(label):
        walked = rec.gc_instances(bases)
        assert walked is not None, "layout not confirmed"
        ids = [id(o) for o in walked]
        assert len(ids) == len(set(ids)), f"{label}: an object was visited twice"
        expected = {id(o) for o in gc.get_objects() if type(o) in classes}
        assert set(ids) == expected, f"{label}: {len(set(ids) - expected)} extra, {len(expected - set(ids))} missed"
        print(label, len(ids))

    check("first walk")
    keep = [torch.zeros(4) for _ in range(3000)] + [torch.nn.Linear(2, 2) for _ in range(300)]
    gc.collect()
    check("all old")
    assert rec.gc_anchors() > 4, rec.gc_anchors()
    check("from anchors, all old")
    gc.freeze()
    check("all frozen")
    gc.unfreeze()
    check("thawed")
    funcs = {}
    for k in range(20000):  # functions the walks may take as anchors, then dropped
        exec(f"def f{k}(): return {k}", funcs)
    gc.collect()
    check("after a full collection")
    check("from anchors")
    del keep[::2]
    funcs.clear()
    gc.collect()
    check("after deletions")
    gc.freeze()
    more = [torch.ones(2) for _ in range(500)]
    check("after gc.freeze")
    gc.unfreeze()
    check("after gc.unfreeze")
    gc.collect(0)
    check("after a young collection")
    """
)


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the native scan reads CPython 3.11's collector layout")
def test_scan_matches_gc_get_objects() -> None:
    assert native.load().frames_supported()
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    labels = [line.split()[0:2] for line in done.stdout.splitlines()]
    assert len(labels) == 11, done.stdout
