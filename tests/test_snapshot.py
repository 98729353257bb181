"""PyTorch memory snapshot import (safe) and export (accepted by torch's own tools)."""

from __future__ import annotations

import copy
import copyreg
import json
import os
import pickle
import pickletools
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from memwarden.errors import InputError
from memwarden.interop.snapshot import load_snapshot, save_snapshot
from memwarden.interop.snapshot_export import to_snapshot
from memwarden.plan.allocator.config import AllocatorConfig
from memwarden.plan.replay import replay
from memwarden.trace import format as trace_format
from memwarden.trace.model import Action, Category, Modality, Phase, SpanKind, Trace, TraceBuilder

FIXTURES = Path(__file__).parent / "fixtures"
SNAPSHOT_FIXTURE = FIXTURES / "small_snapshot.pickle"
EXPECTED_FIXTURE = FIXTURES / "small_snapshot.expected.json"
UPDATE_GOLDEN = os.environ.get("MEMWARDEN_UPDATE_GOLDEN") == "1"
MiB = 1 << 20

# Opcodes torch/utils/viz/MemoryViz.js can unpickle; anything else breaks the viewer.
VIEWER_OPCODES = {
    "PROTO",
    "FRAME",
    "STOP",
    "MARK",
    "MEMOIZE",
    "BINPUT",
    "LONG_BINPUT",
    "BINGET",
    "LONG_BINGET",
    "EMPTY_DICT",
    "EMPTY_LIST",
    "EMPTY_TUPLE",
    "DICT",
    "LIST",
    "TUPLE",
    "TUPLE1",
    "TUPLE2",
    "TUPLE3",
    "APPEND",
    "APPENDS",
    "SETITEM",
    "SETITEMS",
    "NONE",
    "NEWTRUE",
    "NEWFALSE",
    "BININT",
    "BININT1",
    "BININT2",
    "LONG1",
    "BINFLOAT",
    "SHORT_BINUNICODE",
    "BINUNICODE",
}


# -- helpers ------------------------------------------------------------------------


def built_trace() -> Trace:
    """A small VLM-like run: preexisting weights, activations, a KV cache, an mmap, an OOM, spans.

    FREE/UNMAP rows repeat their block's attribution, as the data model says.
    """
    b = TraceBuilder(devices=["cuda:0"])
    base = 0x7F0000000000
    weight = {"device": "cuda:0", "category": Category.WEIGHT, "module": "vision_tower"}
    act = {
        "device": "cuda:0",
        "category": Category.ACTIVATION,
        "modality": Modality.VISION,
        "phase": Phase.ENCODE,
        "module": "vision_tower.encoder.layers.0",
        "op": "aten::mm",
        "dtype": "float16",
        "shape": (1, 577, 1024),
    }
    mapped = {"device": "cuda:0", "category": Category.WEIGHT, "module": "lm_head"}
    temp = {"device": "cuda:0", "category": Category.TEMPORARY, "op": "aten::add"}
    kv = {
        "device": "cuda:0",
        "category": Category.KV_CACHE,
        "modality": Modality.TEXT,
        "phase": Phase.DECODE,
        "module": "language_model.layers.0.self_attn",
    }
    b.event(0, Action.PREEXISTING, 1, base, 8 * MiB, **weight)
    b.event(10, Action.ALLOC, 2, base + 8 * MiB, 30 * MiB, **act)
    b.event(12, Action.MAP, 3, base + 64 * MiB, 3 * MiB, **mapped)
    b.event(20, Action.ALLOC, 4, base + 40 * MiB, 1000, **temp)
    b.event(30, Action.FREE, 2, base + 8 * MiB, 30 * MiB, **act)
    b.event(35, Action.OOM, 9, 0, 80 * MiB, device="cuda:0", op="aten::empty")
    b.event(40, Action.ALLOC, 5, base + 8 * MiB, 2 * MiB, **kv)
    b.event(45, Action.UNMAP, 3, base + 64 * MiB, 3 * MiB, **mapped)
    b.event(50, Action.FREE, 1, base, 8 * MiB, **weight)
    b.span(0, 60, SpanKind.PHASE, "encode", phase=Phase.ENCODE)
    b.span(5, 32, SpanKind.MODULE, "vision_tower", phase=Phase.ENCODE, fingerprint="fp:abc")
    b.span(6, 31, SpanKind.MODULE, "vision_tower.encoder.layers.0", phase=Phase.ENCODE, parent=1, depth=1)
    return b.build()


def format_size(num: float) -> str:
    """The byte formatting of torch.cuda._memory_viz (for matching its printed totals)."""
    for unit in ["", "Ki", "Mi", "Gi", "Ti"]:
        if abs(num) < 1024.0:
            return f"{num:3.1f}{unit}B"
        num /= 1024.0
    return f"{num:.1f}PiB"


def memory_viz(*args: str) -> subprocess.Popen[str]:
    """Start ``python -m torch.cuda._memory_viz ARGS`` (several run at once: each pays torch's import)."""
    command = [sys.executable, "-m", "torch.cuda._memory_viz", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def event_rows(trace: Trace, *actions: Action) -> list[tuple[Any, ...]]:
    """Events as comparable rows (no tensor ids, which are capture-specific)."""
    ev = trace.events
    rows = []
    for r in range(trace.num_events):
        if actions and int(ev["action"][r]) not in actions:
            continue
        rows.append(
            (
                int(ev["time_us"][r]),
                Action(int(ev["action"][r])).name,
                int(ev["nbytes"][r]),
                trace.devices[int(ev["device"][r])],
                Category(int(ev["category"][r])).name,
                Modality(int(ev["modality"][r])).name,
                Phase(int(ev["phase"][r])).name,
                trace.string(int(ev["module"][r])),
                trace.string(int(ev["op"][r])),
                trace.string(int(ev["dtype"][r])),
                trace.shape(int(ev["shape"][r])),
            )
        )
    return rows


def replay_viewer(snapshot: dict[str, Any]) -> None:
    """Check what PyTorch's viewer relies on, replaying each device trace forward.

    Every block lies in a live segment, live blocks never overlap, frees and
    segment frees match what is live, and what is live at the end is exactly
    the active blocks and the segments of ``snapshot['segments']``.
    """
    for device, entries in enumerate(snapshot["device_traces"]):
        segs = {s["address"]: s["total_size"] for s in snapshot["segments"] if s["device"] == device}
        blocks: dict[int, int] = {}
        for seg in snapshot["segments"]:
            if seg["device"] == device:
                blocks.update({b["address"]: b["requested_size"] for b in seg["blocks"] if b["state"] != "inactive"})
        # walk backwards from the end state, as MemoryViz.js does, undoing each entry
        for e in reversed(entries):
            action, addr = e["action"], e.get("addr")
            if action == "alloc":
                assert blocks.pop(addr) == e["size"], e
            elif action == "free_completed":
                assert addr not in blocks, e
                assert any(s <= addr and addr + e["size"] <= s + n for s, n in segs.items()), f"{e} outside segments"
                blocks[addr] = e["size"]
            elif action == "segment_free":
                assert addr not in segs, e
                segs[addr] = e["size"]
            elif action == "segment_alloc":
                assert segs.pop(addr) == e["size"], e
                assert not any(addr <= b < addr + e["size"] for b in blocks), f"{e} frees a segment holding blocks"
            spans = sorted(blocks.items())
            for (a0, n0), (a1, _) in zip(spans, spans[1:], strict=False):
                assert a0 + n0 <= a1, f"live blocks overlap at {a0:#x}"
            for b, n in blocks.items():
                assert any(s <= b and b + n <= s + sz for s, sz in segs.items()), f"block {b:#x} outside segments"


# -- the golden fixture: a snapshot in PyTorch's exact format ---------------------------

T0 = 1_700_000_000_000_000  # time_us is wall-clock microseconds in real snapshots
SEG_A = 0x7F2A00000000
SEG_B = 0x7F2A02000000


def small_snapshot_dict() -> dict[str, Any]:
    """What torch.cuda.memory._snapshot() returns, key for key (torch/csrc/cuda/memory_snapshot.cpp).

    Segment A (20 MiB) predates the ring buffer and holds a weight allocated
    before it (PREEXISTING); segment B is reserved in the trace. One block is
    freed without its alloc in the buffer, one free never completes, one OOM.
    """
    site = "/opt/venv/lib/python3.11/site-packages"
    weights = [
        {"name": "_load_state_dict_into_meta_model", "filename": f"{site}/transformers/modeling_utils.py", "line": 812},
        {"name": "<module>", "filename": "/home/user/serve.py", "line": 3},
    ]
    mlp = [
        {"name": "unwind::unwind", "filename": "??", "line": 0},
        {"name": "forward", "filename": f"{site}/torch/nn/modules/linear.py", "line": 125},
        {"name": "forward", "filename": f"{site}/transformers/models/llava/modeling_llava.py", "line": 210},
        {"name": "<module>", "filename": "/home/user/serve.py", "line": 9},
    ]
    attn = [
        {
            "name": "eager_attention_forward",
            "filename": f"{site}/transformers/models/clip/modeling_clip.py",
            "line": 300,
        }
    ]

    def entry(action: str, addr: int, size: int, t: int, frames: list[Any]) -> dict[str, Any]:
        key = "device_free" if action == "oom" else "addr"
        return {"action": action, key: addr, "size": size, "stream": 0, "frames": frames, "time_us": T0 + t}

    def block(addr: int, size: int, requested: int, state: str, frames: list[Any]) -> dict[str, Any]:
        return {"address": addr, "size": size, "requested_size": requested, "state": state, "frames": frames}

    def segment(addr: int, total: int, blocks: list[dict[str, Any]], kind: str) -> dict[str, Any]:
        allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        active = sum(b["size"] for b in blocks if b["state"] != "inactive")
        requested = sum(b["requested_size"] for b in blocks if b["state"] != "inactive")
        return {
            "device": 0,
            "address": addr,
            "total_size": total,
            "allocated_size": allocated,
            "active_size": active,
            "requested_size": requested,
            "stream": 0,
            "segment_type": kind,
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": blocks,
        }

    trace0 = [
        entry("alloc", SEG_A + 8 * MiB, 4 * MiB, 100, mlp),
        entry("alloc", SEG_A + 12 * MiB, 4 * MiB, 200, mlp),
        entry("free_requested", SEG_A + 12 * MiB, 4 * MiB, 300, mlp),
        entry("free_completed", SEG_A + 12 * MiB, 4 * MiB, 310, mlp),
        entry("free_requested", SEG_A + 16 * MiB, 4 * MiB, 390, weights),  # allocated before the buffer began
        entry("free_completed", SEG_A + 16 * MiB, 4 * MiB, 400, weights),
        entry("segment_alloc", SEG_B, 2 * MiB, 500, attn),
        entry("alloc", SEG_B, 512, 510, attn),
        entry("free_requested", SEG_B, 512, 600, attn),  # completes after the snapshot: active_pending_free
        entry("oom", 123_456_789, 1 << 30, 700, attn),
        entry("alloc", SEG_A + 12 * MiB, 1 * MiB, 800, attn),
        entry("free_requested", SEG_A + 12 * MiB, 1 * MiB, 900, attn),
        entry("free_completed", SEG_A + 12 * MiB, 1 * MiB, 905, attn),
        entry("snapshot", 0, 0, 1000, []),
    ]
    segments = [
        segment(
            SEG_A,
            20 * MiB,
            [
                block(SEG_A, 8 * MiB, 8_000_000, "active_allocated", weights),
                block(SEG_A + 8 * MiB, 4 * MiB, 4 * MiB, "active_allocated", mlp),
                block(SEG_A + 12 * MiB, 8 * MiB, 1 * MiB, "inactive", []),
            ],
            "large",
        ),
        segment(
            SEG_B,
            2 * MiB,
            [block(SEG_B, 512, 512, "active_pending_free", attn), block(SEG_B + 512, 2 * MiB - 512, 0, "inactive", [])],
            "small",
        ),
    ]
    settings = {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": False,
        "pinned_num_register_threads": 1,
        "release_lock_on_cudamalloc": False,
        "pinned_use_cuda_host_register": False,
        "roundup_power2_divisions": {"1": 0, "2": 0},
    }
    return {"segments": segments, "device_traces": [trace0, []], "allocator_settings": settings}


def golden_view(trace: Trace) -> dict[str, Any]:
    rows = [[*row[:3], row[3], row[7], row[8]] for row in event_rows(trace)]
    return {
        "devices": trace.devices,
        "events": [[t, action, nbytes, dev, module, op] for t, action, nbytes, dev, module, op in rows],
        "addresses": [int(a) for a in trace.events["address"]],
        "live_bytes_at_end": int(trace.live_bytes()[-1]),
        "marks": [trace.string(int(i)) for i in trace.spans["name"]],
        "metadata": trace.metadata,
    }


def test_fixture_is_the_snapshot_this_file_describes():
    """The committed pickle is plain PyTorch format, made by small_snapshot_dict() (regenerate with MEMWARDEN_UPDATE_GOLDEN=1)."""
    if UPDATE_GOLDEN:
        FIXTURES.mkdir(exist_ok=True)
        SNAPSHOT_FIXTURE.write_bytes(pickle.dumps(small_snapshot_dict(), protocol=4))
    data = SNAPSHOT_FIXTURE.read_bytes()
    assert {op.name for op, _, _ in pickletools.genops(data)} <= VIEWER_OPCODES
    assert pickle.loads(data) == small_snapshot_dict()


def test_fixture_satisfies_torch_segsum():
    from torch.cuda._memory_viz import segsum

    text = segsum(small_snapshot_dict())
    assert "total_reserved: 22.0MiB" in text


def test_fixture_matches_golden_expectations():
    trace = load_snapshot(SNAPSHOT_FIXTURE)
    view = json.loads(json.dumps(golden_view(trace)))
    if UPDATE_GOLDEN:
        EXPECTED_FIXTURE.write_text(json.dumps(view, indent=1) + "\n")
    assert view == json.loads(EXPECTED_FIXTURE.read_text())


def test_fixture_semantics():
    """The rules the golden file encodes, spelled out."""
    trace = load_snapshot(SNAPSHOT_FIXTURE)
    assert trace.metadata["source"] == "torch-snapshot"
    assert trace.devices == ["cuda:0"]
    ev = trace.events
    start = T0 + 100
    pre = ev["action"] == Action.PREEXISTING
    # the weight alive at snapshot time with no alloc, and the block freed without its alloc
    assert sorted(ev["nbytes"][pre].tolist()) == [4 * MiB, 8_000_000]
    assert set(ev["time_us"][pre].tolist()) == {start}
    # free_requested with no free_completed: the request is the free
    pending = (ev["address"] == SEG_B) & (ev["action"] == Action.FREE)
    assert ev["time_us"][pending].tolist() == [T0 + 600]
    # attribution from frames: innermost kept frame's function, innermost non-torch file
    alloc = np.flatnonzero(ev["action"] == Action.ALLOC)[0]
    assert trace.string(int(ev["op"][alloc])) == "forward"
    assert trace.string(int(ev["module"][alloc])) == "transformers.models.llava.modeling_llava"
    assert set(ev["category"].tolist()) == {Category.OTHER}
    # reserved memory: segment A predates the buffer, segment B is reserved in it
    seg = ev["action"] == Action.SEGMENT_ALLOC
    assert sorted(ev["nbytes"][seg].tolist()) == [2 * MiB, 20 * MiB]
    oom = ev["action"] == Action.OOM
    assert ev["nbytes"][oom].tolist() == [1 << 30]
    assert trace.metadata["ooms"][0]["device_free_bytes"] == 123_456_789
    assert trace.live_bytes()[-1] == 8_000_000 + 4 * MiB
    assert trace.metadata["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"


# -- export accepted by torch's tools -------------------------------------------------


def test_export_accepted_by_torch_memory_viz(tmp_path):
    from torch.cuda._memory_viz import segment_plot
    from torch.cuda._memory_viz import trace as viz_trace

    trace = built_trace()
    path = save_snapshot(trace, tmp_path / "out.pickle")
    live_at_end = int(trace.live_bytes()[-1])
    assert live_at_end == 2 * MiB + 1000

    html = tmp_path / "trace_plot.html"
    running = [memory_viz("stats", str(path)), memory_viz("trace_plot", str(path), "-o", str(html))]
    stats, plot = (process.communicate(timeout=120) for process in running)
    assert running[0].returncode == 0, stats
    assert f"total_allocated: {format_size(live_at_end)}" in stats[0]
    assert f"total_reserved: {format_size(live_at_end)}" in stats[0]
    assert "segments: 2" in stats[0]
    assert running[1].returncode == 0, plot
    assert "snapshot.pickle" in html.read_text()

    snapshot = pickle.loads(path.read_bytes())
    assert "raise OutOfMemoryError # 80.0MiB requested" in viz_trace(snapshot)
    assert "snapshot.pickle" in segment_plot(snapshot)


def test_export_is_plain_data_the_viewer_can_read(tmp_path):
    trace = built_trace()
    data = save_snapshot(trace, tmp_path / "out.pickle").read_bytes()
    assert data[:2] == b"\x80\x04"
    assert {op.name for op, _, _ in pickletools.genops(data)} <= VIEWER_OPCODES
    snapshot = pickle.loads(data)
    replay_viewer(snapshot)
    entries = snapshot["device_traces"][0]
    alloc = next(e for e in entries if e["action"] == "alloc" and e["size"] == 30 * MiB)
    assert alloc["frames"][0] == {"filename": "vision_tower.encoder.layers.0", "line": 0, "name": "aten::mm"}
    assert "category=activation" in alloc["frames"][1]["name"]
    assert "phase=encode" in alloc["frames"][1]["name"]
    assert {e["action"] for e in entries} >= {"alloc", "free_requested", "free_completed", "oom"}
    assert set(snapshot["allocator_settings"]) >= {"expandable_segments", "max_split_size"}


def test_export_round_trips_through_load_snapshot():
    trace = built_trace()
    back = load_snapshot(pickle.dumps(to_snapshot(trace), protocol=4))
    assert event_rows(back) == event_rows(trace)
    assert np.array_equal(back.live_bytes(), trace.live_bytes())


def test_export_invents_addresses_when_the_trace_has_none():
    """CPU captures may carry no usable addresses; blocks must still be disjoint for the viewer."""
    b = TraceBuilder(devices=["cpu"])
    for i in range(6):
        b.event(i, Action.ALLOC, i, 0, 1000 + i, category=Category.ACTIVATION)
    for i in range(0, 6, 2):
        b.event(10 + i, Action.FREE, i, 0, 1000 + i)
    trace = b.build()
    snapshot = to_snapshot(trace)
    replay_viewer(snapshot)
    addrs = [e["addr"] for e in snapshot["device_traces"][0] if e["action"] == "alloc"]
    assert len(set(addrs)) == 6 and 0 not in addrs
    from torch.cuda._memory_viz import segsum

    assert f"total_allocated: {format_size(1001 + 1003 + 1005)}" in segsum(snapshot)


def test_export_uses_given_allocator_segments():
    trace = built_trace()
    base = 0x7F0000000000
    segments = [
        {
            "device": 0,
            "address": base,
            "total_size": 20 * MiB,
            "allocated_size": 2 * MiB + 1024,
            "active_size": 2 * MiB + 1024,
            "requested_size": 2 * MiB + 1000,
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": [
                {
                    "address": base,
                    "size": 2 * MiB,
                    "requested_size": 2 * MiB,
                    "state": "active_allocated",
                    "frames": [],
                },
                {
                    "address": base + 2 * MiB,
                    "size": 1024,
                    "requested_size": np.int64(1000),
                    "state": "active_allocated",
                    "frames": [],
                },
                {
                    "address": base + 2 * MiB + 1024,
                    "size": 18 * MiB - 1024,
                    "requested_size": 0,
                    "state": "inactive",
                    "frames": [],
                },
            ],
        }
    ]
    snapshot = to_snapshot(trace, segments, allocator_settings={"expandable_segments": True})
    replay_viewer(snapshot)  # live blocks moved onto the given blocks, freed ones in segments of their own
    allocs = {e["addr"]: e["size"] for e in snapshot["device_traces"][0] if e["action"] == "alloc"}
    assert allocs[base] == 2 * MiB and allocs[base + 2 * MiB] == 1000
    given_blocks = [(b["address"], b["size"], b["state"]) for b in segments[0]["blocks"]]
    assert [(b["address"], b["size"], b["state"]) for b in snapshot["segments"][0]["blocks"]] == given_blocks
    assert type(snapshot["segments"][0]["blocks"][1]["requested_size"]) is int  # numpy ints made plain
    assert {op.name for op, _, _ in pickletools.genops(pickle.dumps(snapshot, protocol=4))} <= VIEWER_OPCODES
    assert snapshot["allocator_settings"]["expandable_segments"] is True
    from torch.cuda._memory_viz import segsum

    assert "total_reserved: 20.0MiB" in segsum(snapshot)
    broken = copy.deepcopy(segments)
    broken[0]["blocks"].pop()
    with pytest.raises(ValueError, match="blocks cover"):
        to_snapshot(trace, broken)


def test_export_with_the_allocator_model_segments(tmp_path):
    trace = built_trace()
    for config in (AllocatorConfig(), AllocatorConfig(expandable_segments=True)):
        result = replay(trace, config)
        snapshot = to_snapshot(trace, result.segments_at_end_snapshot)
        replay_viewer(snapshot)
        from torch.cuda._memory_viz import segsum

        assert f"total_reserved: {format_size(result.reserved_bytes[-1])}" in segsum(snapshot)


@st.composite
def random_traces(draw: Any, device_names: tuple[str, ...] = ("cuda:0", "cuda:1", "cpu")) -> Trace:
    """Random alloc/free sequences on a few devices, some blocks alive before the trace."""
    b = TraceBuilder(devices=["cuda:0"])
    live: list[tuple[int, int, dict[str, Any]]] = []  # (tensor, bytes, attribution)
    devices = st.sampled_from(device_names)
    for tensor in range(draw(st.integers(0, 3))):
        attribution = {"device": draw(devices), "category": Category.WEIGHT, "module": "w"}
        nbytes = draw(st.integers(1, 50 * MiB))
        b.event(0, Action.PREEXISTING, tensor, 0, nbytes, **attribution)
        live.append((tensor, nbytes, attribution))
    next_id = len(live)
    for t in range(1, draw(st.integers(1, 40))):
        if live and draw(st.booleans()):
            tensor, nbytes, attribution = live.pop(draw(st.integers(0, len(live) - 1)))
            b.event(t, Action.FREE, tensor, 0, nbytes, **attribution)
        else:
            attribution = {
                "device": draw(devices),
                "category": draw(st.sampled_from(list(Category))),
                "module": f"m{t % 3}",
            }
            nbytes = draw(st.integers(1, 50 * MiB))
            b.event(t, Action.ALLOC, next_id, 0, nbytes, **attribution)
            live.append((next_id, nbytes, attribution))
            next_id += 1
    return b.build()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_traces())
def test_export_invariants_hold_for_random_traces(trace):
    from torch.cuda._memory_viz import segsum
    from torch.cuda._memory_viz import trace as viz_trace

    snapshot = to_snapshot(trace)
    replay_viewer(snapshot)
    segsum(snapshot)  # asserts internal + external free + allocated == reserved, per segment and in total
    viz_trace(snapshot)
    allocated = sum(b["requested_size"] for s in snapshot["segments"] for b in s["blocks"])
    assert allocated == (int(trace.live_bytes()[-1]) if trace.num_events else 0)
    back = load_snapshot(pickle.dumps(snapshot, protocol=4))
    # same events; blocks alive before the trace all sit at its start, in any order
    assert sorted(event_rows(back)) == sorted(event_rows(trace))
    for name in {trace.devices[d] for d in trace.events["device"].tolist()}:
        assert back.live_bytes(back.device_index(name))[-1] == trace.live_bytes(trace.device_index(name))[-1]


# -- hostile and malformed input ------------------------------------------------------


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_that_runs_code_is_refused_and_nothing_runs(tmp_path):
    marker = Path(f"/tmp/PWNED_{uuid.uuid4().hex}")
    payload = pickle.dumps(_Evil(marker))
    nested = pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "frames": _Evil(marker)}]]})
    try:
        for data in (payload, nested):
            with pytest.raises(InputError) as info:
                load_snapshot(data)
            assert "refused: pickle references os.system; memwarden never runs code from a file" in str(info.value)
        path = tmp_path / "evil.pickle"
        path.write_bytes(payload)
        with pytest.raises(InputError, match=f"{path}: refused"):
            load_snapshot(path)
        assert not marker.exists()
    finally:
        marker.unlink(missing_ok=True)


@pytest.mark.parametrize(
    "data, reason",
    [
        (pickle.dumps(eval, protocol=4), "builtins.eval"),  # STACK_GLOBAL
        (b"(S'touch /tmp/x'\nios\nsystem\n.", "os.system"),  # INST, protocol 0
        (b"cos\nsystem\n(S'id'\ntR.", "os.system"),  # GLOBAL + REDUCE
        (b"\x80\x02(K\x01lQ.", "persistent id"),  # BINPERSID
    ],
)
def test_every_route_to_a_callable_is_refused(data, reason):
    with pytest.raises(InputError, match=f"refused: pickle references .*{reason}"):
        load_snapshot(data)


def test_registered_pickle_extension_is_refused():
    copyreg.add_extension("os", "system", 0x7FFFFF01)
    try:
        with pytest.raises(InputError, match="refused: pickle references os.system"):
            load_snapshot(b"\x80\x02\x84\x01\xff\xff\x7f.")  # EXT4
    finally:
        copyreg.remove_extension("os", "system", 0x7FFFFF01)


def _valid_bytes() -> bytes:
    return pickle.dumps(small_snapshot_dict(), protocol=4)


def _with(change: Any) -> bytes:
    snapshot = small_snapshot_dict()
    change(snapshot)
    return pickle.dumps(snapshot, protocol=4)


@pytest.mark.parametrize(
    "data, message",
    [
        (_valid_bytes()[:700], "not a readable pickle"),
        (_valid_bytes()[:1], "not a readable pickle"),
        (pickle.dumps([1, 2, 3]), "top level is a list"),
        (pickle.dumps("segments"), "top level is a str"),
        (pickle.dumps({"segments": []}), "has no 'device_traces'"),
        (pickle.dumps({"device_traces": []}), "has no 'segments'"),
        (pickle.dumps({"segments": {}, "device_traces": []}), "'segments' must be a list"),
        (pickle.dumps({"segments": [], "device_traces": [{}]}), r"device_traces\[0\] must be a list"),
        (_with(lambda s: s["device_traces"][0][1].pop("addr")), r"device_traces\[0\]\[1\] has no 'addr'"),
        (_with(lambda s: s["device_traces"][0][0].update(size="4MiB")), "'size' must be an integer, got str"),
        (_with(lambda s: s["device_traces"][0][0].update(size=1 << 70)), "out of range"),
        (_with(lambda s: s["device_traces"][0][0].update(size=-1)), "out of range"),
        (_with(lambda s: s["device_traces"][0][0].update(action=7)), "has no string 'action'"),
        (_with(lambda s: s["device_traces"][0][0].update(frames=[{"line": 1}])), "needs string 'name'"),
        (_with(lambda s: s["segments"][0].update(total_size=1 << 64)), "'total_size' is out of range"),
        (_with(lambda s: s["segments"][0]["blocks"][0].update(state="weird")), "unknown state"),
        (_with(lambda s: s["segments"][1].pop("blocks")), r"segments\[1\] has no 'blocks'"),
        (b"\x80\x04\x8e" + (1 << 62).to_bytes(8, "little") + b"x.", "not a readable pickle"),  # BINBYTES8, 4 EiB
        (b"\x80\x04X\xff\xff\xff\xffabc.", "not a readable pickle"),  # BINUNICODE, 4 GiB
        (b"\x80\x04\x82\x01.", "not a readable pickle"),  # EXT1 of an unregistered code
    ],
)
def test_malformed_snapshots_are_input_errors(data, message):
    with pytest.raises(InputError, match=message):
        load_snapshot(data)


def test_shared_list_bomb_is_refused():
    entries = [{"action": "alloc", "addr": 1 << 20, "size": 1, "time_us": 0}] * 2000
    data = pickle.dumps({"segments": [], "device_traces": [entries] * 1000})
    assert len(data) < 20_000
    with pytest.raises(InputError, match="pickle bomb"):
        load_snapshot(data)


def test_size_limit(tmp_path):
    path = tmp_path / "big.pickle"
    path.write_bytes(_valid_bytes())
    with pytest.raises(InputError, match="larger than the 100-byte limit"):
        load_snapshot(path, max_bytes=100)
    assert load_snapshot(path).num_events > 0


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        out += _paths(value, (*prefix, key))
    return out


_JUNK = [None, -1, 0, 1 << 70, "x", b"b", 1.5, float("nan"), [], {}, (1, 2), True, [{}], {"a": 1}, 2**64]


@settings(max_examples=200, deadline=None)
@given(
    base=st.sampled_from(["fixture", "export"]),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(range(len(_JUNK) + 1))), min_size=1, max_size=3),
)
def test_mutated_snapshots_raise_only_input_error(base, edits):
    """Any field replaced by any plain value, or deleted: a Trace or an InputError, nothing else."""
    snapshot = small_snapshot_dict() if base == "fixture" else to_snapshot(built_trace())
    paths = _paths(snapshot)[1:]
    for where, junk in edits:
        path = paths[where % len(paths)]
        parent = snapshot
        try:
            for key in path[:-1]:
                parent = parent[key]
            if junk == len(_JUNK):
                del parent[path[-1]]
            else:
                parent[path[-1]] = copy.deepcopy(_JUNK[junk])
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or replaced this path
    try:
        trace = load_snapshot(pickle.dumps(snapshot, protocol=4))
    except InputError:
        return
    assert event_rows(trace_format.loads(trace_format.dumps(trace))) == event_rows(trace)  # what loads can be saved


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_traces(("cuda:0",)), st.booleans())
def test_export_with_allocator_segments_for_random_traces(trace, expandable):
    from torch.cuda._memory_viz import segsum

    assume(trace.num_events > 0)  # the allocator model's own business
    result = replay(trace, AllocatorConfig(expandable_segments=expandable))
    snapshot = to_snapshot(trace, result.segments_at_end_snapshot)
    replay_viewer(snapshot)
    segsum(snapshot)
