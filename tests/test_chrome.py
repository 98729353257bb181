"""Chrome/Perfetto trace-event export."""

from __future__ import annotations

import json

import numpy as np

from memwarden.interop.chrome import MAX_COUNTER_POINTS, save_chrome, to_chrome
from memwarden.trace.model import Action, Category, Phase, SpanKind, Trace, TraceBuilder, enum_name
from test_snapshot import built_trace


def counters(doc: dict) -> dict[tuple[int, str], list[tuple[float, int]]]:
    series: dict[tuple[int, str], list[tuple[float, int]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "C":
            series.setdefault((e["pid"], e["name"]), []).append((e["ts"], e["args"]["bytes"]))
    return series


def device_pid(doc: dict, device: str) -> int:
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name" and e["args"]["name"] == f"memory {device}":
            return e["pid"]
    raise AssertionError(f"no process for {device}")


def category_bytes_at_end(trace: Trace, device: int, category: Category) -> int:
    mask = (trace.events["device"] == device) & (trace.events["category"] == category)
    return int(trace.signed_bytes()[mask].sum())


def test_chrome_json_loads_and_has_every_track(tmp_path):
    trace = built_trace()
    path = save_chrome(trace, tmp_path / "trace.json")
    doc = json.loads(path.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]  # no temp file left behind
    assert doc == json.loads(json.dumps(to_chrome(trace)))

    events = doc["traceEvents"]
    names = {(e["name"], e["args"]["name"]) for e in events if e["ph"] == "M" and "name" in e["args"]}
    assert {("process_name", "memwarden spans"), ("thread_name", "modules"), ("thread_name", "phases")} <= names
    assert ("process_name", "memory cuda:0") in names
    for e in events:
        assert e["ph"] == "M" or isinstance(e["ts"], int | float)


def test_counter_final_values_match_live_bytes():
    trace = built_trace()
    doc = to_chrome(trace)
    series = counters(doc)
    pid = device_pid(doc, "cuda:0")
    d = trace.device_index("cuda:0")
    used = {Category(c) for c in trace.events["category"][trace.signed_bytes() != 0].tolist()}
    assert used == {Category.WEIGHT, Category.ACTIVATION, Category.TEMPORARY, Category.KV_CACHE}
    for category in used:
        points = series[(pid, f"{enum_name(category)} bytes")]
        assert points[-1][1] == category_bytes_at_end(trace, d, category)
    finals = sum(series[(pid, f"{enum_name(c)} bytes")][-1][1] for c in used)
    assert finals == trace.live_bytes()[-1] == series[(pid, "live bytes")][-1][1]
    # one event per change: the live-bytes track follows the trace exactly
    changed = trace.signed_bytes() != 0
    assert [v for _, v in series[(pid, "live bytes")]] == trace.live_bytes()[changed].tolist()
    assert max(v for _, v in series[(pid, "live bytes")]) == trace.live_bytes().max()


def test_module_spans_become_complete_events():
    trace = built_trace()
    doc = to_chrome(trace)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    modules = [e for e in xs if e["cat"] == "module"]
    spans = trace.spans
    module_rows = np.flatnonzero(spans["kind"] == SpanKind.MODULE).tolist()
    assert len(modules) == len(module_rows) == 2
    for row, e in zip(module_rows, modules, strict=True):
        assert e["name"] == trace.string(int(spans["name"][row]))
        assert e["ts"] == spans["start_us"][row] and e["dur"] == spans["end_us"][row] - spans["start_us"][row]
        assert e["args"]["phase"] == "encode"
        assert e["tid"] == modules[0]["tid"]
    assert modules[0]["args"]["fingerprint"] == "fp:abc"
    assert modules[1]["args"]["parent"] == "vision_tower"
    phases = [e for e in xs if e["cat"] == "phase"]
    assert [p["name"] for p in phases] == ["encode"] and phases[0]["tid"] != modules[0]["tid"]
    ooms = [e for e in doc["traceEvents"] if e["ph"] == "i" and e["name"] == "OOM"]
    assert ooms and ooms[0]["args"]["requested_bytes"] == 80 << 20


def test_reserved_bytes_track_from_segments():
    b = TraceBuilder(devices=["cuda:0"])
    b.event(0, Action.SEGMENT_ALLOC, 1, 1 << 30, 20 << 20, device="cuda:0")
    b.event(1, Action.ALLOC, 2, 1 << 30, 1 << 20, device="cuda:0", category=Category.ACTIVATION)
    b.event(2, Action.FREE, 2, 1 << 30, 1 << 20, device="cuda:0", category=Category.ACTIVATION)
    b.event(3, Action.SEGMENT_FREE, 1, 1 << 30, 20 << 20, device="cuda:0")
    doc = to_chrome(b.build())
    pid = device_pid(doc, "cuda:0")
    assert counters(doc)[(pid, "reserved bytes")] == [(0, 20 << 20), (3, 0)]


def test_large_traces_are_thinned_but_keep_peaks_and_final_values():
    rng = np.random.default_rng(0)
    n, budget = 40_000, 2_000
    b = TraceBuilder(devices=["cuda:0", "cpu"])
    live: list[tuple[int, int, str, Category]] = []
    for i in range(n):
        if live and rng.random() < 0.5:
            tensor, nbytes, dev, cat = live.pop(int(rng.integers(len(live))))
            b.event(i, Action.FREE, tensor, 0, nbytes, device=dev, category=cat)
        else:
            nbytes = int(rng.integers(1, 1 << 20))
            dev = "cuda:0" if rng.random() < 0.7 else "cpu"
            cat = Category(int(rng.integers(3)))
            b.event(i, Action.ALLOC, i, 0, nbytes, device=dev, category=cat, phase=Phase.DECODE)
            live.append((i, nbytes, dev, cat))
    trace = b.build()
    doc = to_chrome(trace, max_counter_points=budget)
    points = sum(len(v) for v in counters(doc).values())
    assert points <= budget * 1.05
    assert MAX_COUNTER_POINTS == 20_000
    for device in ("cuda:0", "cpu"):
        pid, d = device_pid(doc, device), trace.device_index(device)
        total = counters(doc)[(pid, "live bytes")]
        assert total[-1][1] == trace.live_bytes(d)[-1]
        assert max(v for _, v in total) == trace.live_bytes(d).max()
        assert [t for t, _ in total] == sorted(t for t, _ in total)
        for c in range(3):
            assert counters(doc)[(pid, f"{enum_name(Category(c))} bytes")][-1][1] == category_bytes_at_end(
                trace, d, Category(c)
            )


def test_empty_trace():
    doc = json.loads(json.dumps(to_chrome(TraceBuilder().build())))
    assert not [e for e in doc["traceEvents"] if e["ph"] in ("C", "X")]


def test_metadata_is_strict_json(tmp_path):
    b = TraceBuilder(metadata={"threshold": float("nan"), "path": tmp_path})
    doc = json.loads(save_chrome(b.build(), tmp_path / "t.json").read_text())
    assert doc["otherData"]["metadata"] == {"threshold": "NaN", "path": str(tmp_path)}
