"""The block each CUDA allocation got, mirrored from the memory history's real addresses.

``torch.cuda.memory_allocated()`` counts whole blocks where the caching allocator did not split
a free block (should_split: remainder at most 1 MiB in the large pool). The histories here are
written in the format ``torch.cuda.memory._snapshot()`` returns, at the addresses the allocator
would have chosen; the recorded H200 history in tests/fixtures is checked against the run's own
``max_memory_allocated``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from memwarden.interop.cuda_blocks import allocated_block_bytes, round_block
from memwarden.interop.snapshot import load_snapshot
from memwarden.interop.snapshot_import import snapshot_to_trace
from memwarden.plan.replay import replay
from memwarden.trace.model import Action

MiB = 1 << 20
BASE = 0x7F00_0000_0000
FIXTURES = Path(__file__).parent / "fixtures"


def _history(entries: list[tuple[str, int, int]], **settings: object) -> dict:
    trace = [
        {"action": a, "addr": addr, "size": size, "stream": 0, "time_us": 1_000 + i, "frames": []}
        for i, (a, addr, size) in enumerate(entries)
    ]
    return {
        "segments": [],
        "device_traces": [trace],
        "allocator_settings": {"expandable_segments": False, "max_split_size": -1, **settings},
    }


def _blocks(history: dict) -> list[int]:
    trace = snapshot_to_trace(history, 1 << 30)
    sizes = allocated_block_bytes(trace)
    rows = np.flatnonzero(trace.events["action"] == Action.ALLOC)
    return [int(sizes[r]) for r in rows]


def test_a_large_request_that_leaves_at_most_1_mib_gets_the_whole_segment() -> None:
    request = 19 * MiB + 512 * 1024  # 19.5 MiB in a fresh 20 MiB segment: 0.5 MiB left, not split
    history = _history([("segment_alloc", BASE, 20 * MiB), ("alloc", BASE, request)])
    assert _blocks(history) == [20 * MiB]


def test_a_split_block_counts_the_rounded_request_and_a_freed_cached_block_is_reused_whole() -> None:
    entries = [
        ("segment_alloc", BASE, 20 * MiB),
        ("alloc", BASE, 12 * MiB + 100),  # 8 MiB left over: split
        ("free_requested", BASE, 12 * MiB + 100),
        ("free_completed", BASE, 12 * MiB + 100),  # merges back into one 20 MiB free block
        ("alloc", BASE, 19 * MiB + 900 * 1024),  # 0.12 MiB left over: the whole cached block
    ]
    assert _blocks(_history(entries)) == [round_block(12 * MiB + 100), 20 * MiB]


def test_blocks_next_to_each_other_in_different_segments_never_merge() -> None:
    entries = [
        ("segment_alloc", BASE, 20 * MiB),
        ("segment_alloc", BASE + 20 * MiB, 20 * MiB),  # cudaMalloc may return adjacent ranges
        ("alloc", BASE, 4 * MiB),
        ("alloc", BASE + 20 * MiB, 4 * MiB),
        ("free_requested", BASE + 20 * MiB, 4 * MiB),
        ("free_completed", BASE + 20 * MiB, 4 * MiB),
        ("free_requested", BASE, 4 * MiB),
        ("free_completed", BASE, 4 * MiB),
        ("alloc", BASE, 19 * MiB + 512 * 1024),  # the first segment alone: whole 20 MiB, not 40
    ]
    assert _blocks(_history(entries)) == [4 * MiB, 4 * MiB, 20 * MiB]


def test_expandable_segments_always_split() -> None:
    request = 19 * MiB + 512 * 1024
    history = _history([("segment_map", BASE, 20 * MiB), ("alloc", BASE, request)], expandable_segments=True)
    assert _blocks(history) == [round_block(request)]


def test_the_allocator_model_fed_block_sizes_reserves_and_allocates_as_the_real_run() -> None:
    """The recorded H200 run: block sizes sum to max_memory_allocated, and the model still agrees."""
    facts = json.loads((FIXTURES / "cuda_run.json").read_text())
    trace = load_snapshot(FIXTURES / "cuda_history.pickle")
    sized = dataclasses.replace(trace, events={**trace.events, "nbytes": allocated_block_bytes(trace)})
    assert int(sized.live_bytes(device=0).max()) == facts["max_memory_allocated"]
    result = replay(sized, device=0)
    assert result.peak_reserved_bytes == facts["max_memory_reserved"]
    assert result.peak_allocated_bytes == facts["max_memory_allocated"]


def test_a_generate_with_whole_blocks_sums_to_max_memory_allocated_exactly() -> None:
    """Qwen2-VL (small) generating 4 tokens on the H200: some blocks were handed out unsplit, so the
    requests rounded to 512 B read 1.04 % under max_memory_allocated; the mirrored blocks read it."""
    facts = json.loads((FIXTURES / "cuda_run_qwen2vl.json").read_text())
    trace = load_snapshot(FIXTURES / "cuda_history_qwen2vl.pickle")
    rounded = np.where(trace.events["nbytes"] > 0, -(-trace.events["nbytes"] // 512) * 512, 0)
    for sizes, exact in ((rounded, False), (allocated_block_bytes(trace), True)):
        peak = int(dataclasses.replace(trace, events={**trace.events, "nbytes": sizes}).live_bytes(device=0).max())
        assert (peak == facts["max_memory_allocated"]) is exact, (peak, facts["max_memory_allocated"])
    assert replay(trace, device=0).peak_reserved_bytes == facts["max_memory_reserved"]
