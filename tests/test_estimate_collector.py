"""The garbage collector during an estimate (estimation/collector.py): paused while the libraries
import, their objects frozen during the meta runs, and left as it was found afterwards, also where
the caller manages it. (That the figures do not move is what every other estimate test checks.)"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from memwarden.estimation.collector import EstimateCollector
from memwarden.estimation.run import estimate


@pytest.fixture
def collector_state() -> Iterator[None]:
    """Whatever a test does to the collector is undone after it."""
    enabled = gc.isenabled()
    assert gc.get_freeze_count() == 0  # nothing in the suite freezes objects for good
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_paused_until_the_imports_then_frozen_then_as_it_was(collector_state: None) -> None:
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with EstimateCollector() as collector:
        assert not gc.isenabled()
        collector.imports_done()
        assert gc.isenabled() and gc.get_freeze_count() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_an_error_inside_leaves_the_collector_as_it_was(collector_state: None) -> None:
    for done in (False, True):
        with pytest.raises(RuntimeError), EstimateCollector() as collector:
            if done:
                collector.imports_done()
            raise RuntimeError("inside")
        assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_collector_the_caller_switched_off_stays_off_and_nothing_is_frozen(collector_state: None) -> None:
    gc.disable()
    with EstimateCollector() as collector:
        collector.imports_done()
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    assert not gc.isenabled()


class _Node:
    pass


def test_objects_the_caller_froze_stay_frozen(collector_state: None) -> None:
    # A reference cycle the caller froze, then dropped: frozen, no collection reaches it; unfrozen,
    # the next one would. (Counting frozen objects would not do: any of them may die meanwhile.)
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    gc.freeze()
    del a, b
    with EstimateCollector() as collector:
        collector.imports_done()
        assert gc.isenabled() and gc.get_freeze_count() > 0
    gc.collect()
    assert alive() is not None  # still frozen: the collector left the caller's freeze alone


def test_an_estimate_and_a_failed_one_leave_the_collector_as_they_found_it(collector_state: None) -> None:
    estimate("qwen2-vl", prompt_tokens=16, new_tokens=2, suggest=False)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with pytest.raises(ValueError):
        estimate("qwen2-vl", prompt_tokens=0, new_tokens=2, suggest=False)
    assert gc.isenabled() and gc.get_freeze_count() == 0
