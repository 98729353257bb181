"""`memwarden replay` and `memwarden plan` as real subprocesses."""

from __future__ import annotations

import json

import pytest

from memwarden.trace.io import save
from memwarden.trace.model import Action, TraceBuilder

MiB = 1 << 20

REPLAY_KEYS = {
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "fragmentation",
    "reserved_unallocated_at_peak_bytes",
    "largest_free_block_at_peak_bytes",
    "segments_at_peak",
    "num_alloc_retries",
    "oom_at_event",
}


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    """Eight 16 MiB tensors, freed, then four 32 MiB tensors (the 256 MiB worked example)."""
    b = TraceBuilder(devices=["cuda:0"])
    t = 0
    for i in range(8):
        b.event(t, Action.ALLOC, i, 0, 16 * MiB, device="cuda:0")
        t += 1
    for i in range(8):
        b.event(t, Action.FREE, i, 0, 16 * MiB, device="cuda:0")
        t += 1
    for i in range(8, 12):
        b.event(t, Action.ALLOC, i, 0, 32 * MiB, device="cuda:0")
        t += 1
    path = tmp_path_factory.mktemp("replay") / "small.mwtrace"
    save(b.build(), path)
    return path


def json_of(done) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_replay_json(cli, small_trace):
    data = json_of(cli("replay", str(small_trace), "--json"))
    assert set(data) == REPLAY_KEYS
    assert data["peak_reserved_bytes"] == 256 * MiB
    assert data["peak_allocated_bytes"] == 128 * MiB
    assert data["oom_at_event"] is None


def test_replay_allocators_and_heatmap(cli, small_trace, tmp_path):
    png = tmp_path / "heat.png"
    data = json_of(
        cli("replay", str(small_trace), "--allocator", "pytorch-expandable", "--json", "--heatmap", str(png))
    )
    assert data["peak_reserved_bytes"] == 140 * MiB  # seven 20 MiB pages
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json_of(cli("replay", str(small_trace), "--allocator", "arena", "--json"))
    assert data["peak_reserved_bytes"] == 128 * MiB


def test_replay_limit_retries_and_oom(cli, small_trace):
    data = json_of(cli("replay", str(small_trace), "--limit", "150MiB", "--json"))
    assert data["num_alloc_retries"] == 1 and data["oom_at_event"] is None
    data = json_of(
        cli("replay", str(small_trace), "--limit", "100MiB", "--alloc-conf", "max_split_size_mb:64", "--json")
    )
    assert data["oom_at_event"] == 6  # the seventh 16 MiB tensor would need 112 MiB


def test_replay_table(cli, small_trace):
    done = cli("replay", str(small_trace))
    assert done.returncode == 0, done.stderr
    assert "peak reserved" in done.stdout and "256.0 MiB" in done.stdout and "50.0%" in done.stdout


def test_plan(cli, small_trace):
    data = json_of(cli("plan", str(small_trace), "--json", "--strategy", "greedy-by-breadth"))
    assert {"arena_bytes", "lower_bound_bytes", "naive_bytes", "tensors"} <= set(data)
    assert data["arena_bytes"] == data["lower_bound_bytes"] == 128 * MiB
    assert data["naive_bytes"] == 256 * MiB
    assert set(data["tensors"][0]) == {"id", "offset", "bytes", "first", "last"}
    done = cli("plan", str(small_trace))
    assert done.returncode == 0 and "lower bound" in done.stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (["replay", "{missing}"], "no such file"),
        (["replay", "{garbage}"], "unknown file type"),
        (["replay", "{trace}", "--alloc-conf", "max_split_size_mb:banana"], "--alloc-conf"),
        (["replay", "{trace}", "--alloc-conf", "bogus_option:1"], "unknown option 'bogus_option'"),
        (["replay", "{trace}", "--limit", "lots"], "--limit"),
        (["replay", "{trace}", "--allocator", "jemalloc"], "unknown --allocator"),
        (["replay", "{trace}", "--device", "cuda:7"], "--device"),
        (["plan", "{trace}", "--strategy", "first-fit"], "unknown --strategy"),
        (["plan", "{missing}"], "no such file"),
    ],
)
def test_bad_input_is_one_clear_line(cli, small_trace, tmp_path, args, words):
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"this is not a trace")
    paths = {"missing": str(tmp_path / "missing.mwtrace"), "garbage": str(garbage), "trace": str(small_trace)}
    done = cli(*[a.format(**paths) for a in args])
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert words in lines[0]
    assert "Traceback" not in done.stderr


def test_heatmap_matrix_states():
    import numpy as np

    from memwarden.plan.records import LayoutHistory
    from memwarden.report.heatmap import ALLOCATED, CACHED_FREE, UNMAPPED, heatmap_matrix

    seg = np.array([[1000, 400]])
    history = LayoutHistory(
        event_index=np.array([0, 1, 2]),
        segments=[np.zeros((0, 2), np.int64), seg, seg],
        blocks=[np.zeros((0, 3), np.int64), np.array([[1000, 100, 1], [1100, 300, 0]]), np.array([[1000, 400, 0]])],
    )
    image, total = heatmap_matrix(history, rows=4)
    assert total == 400
    assert image[:, 0].tolist() == [UNMAPPED] * 4
    assert image[:, 1].tolist() == [ALLOCATED, CACHED_FREE, CACHED_FREE, CACHED_FREE]
    assert image[:, 2].tolist() == [CACHED_FREE] * 4
