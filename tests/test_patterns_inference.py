"""Inference-side overflow patterns: alignment-padding, kv-reprefill, kv-concat-growth,
vision-token-dominance.

Each scenario in ``examples/scenarios/<pattern>/`` makes the mistake; its ``*_fixed.py`` twin
does not. Captured in-process, the scenario must yield the pattern, the twin must not, and the
fix must realise at least half of the waste the finding claims. Hand-built traces pin each
detector's rules, negative cases included.
"""

from __future__ import annotations

import functools
import runpy
import sys
from pathlib import Path

import pytest

from memwarden.analyze.diagnose import Context, Finding, diagnose
from memwarden.analyze.patterns import alignment_padding, kv_concat_growth
from memwarden.analyze.timeline import summary
from memwarden.trace.model import Action, Category, Trace, TraceBuilder

SCENARIOS = Path(__file__).resolve().parents[1] / "examples" / "scenarios"
MINE = ["alignment-padding", "kv-reprefill", "kv-concat-growth", "vision-token-dominance"]


@functools.cache
def captured(relpath: str) -> Trace:
    """Run a scenario as ``__main__`` under capture, once per session."""
    import memwarden

    path = SCENARIOS / relpath
    saved_argv = sys.argv[:]
    sys.argv = [str(path)]
    try:
        with memwarden.capture() as cap:
            runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv = saved_argv
    assert cap.trace is not None
    return cap.trace


def findings_of(trace: Trace, pattern: str) -> list[Finding]:
    return [f for f in diagnose(trace, patterns=[pattern]) if f.pattern == pattern]


def peak(trace: Trace) -> int:
    return summary(trace).peak_bytes


# -- scenarios: found, absent in the twin, claimed waste realised --------------------------------------

PEAK_SCENARIOS = [
    ("alignment-padding", "pow2_fusion_padding"),
    ("alignment-padding", "projector_max_tokens"),
    ("kv-concat-growth", "manual_kv_list_concat"),
    ("kv-concat-growth", "stacked_kv_tensor"),
]


@pytest.mark.parametrize(("pattern", "name"), PEAK_SCENARIOS)
def test_scenario_found_fixed_twin_clean_and_peak_waste_realised(pattern: str, name: str) -> None:
    bad = captured(f"{pattern}/{name}.py")
    good = captured(f"{pattern}/{name}_fixed.py")
    found = findings_of(bad, pattern)
    assert found, f"{name}: no {pattern} finding"
    assert all(f.pattern == pattern and f.fix and f.evidence for f in found)
    assert findings_of(good, pattern) == [], f"{name}_fixed still shows {pattern}"
    claimed = sum(f.wasted_bytes for f in found)
    realised = peak(bad) - peak(good)
    assert realised >= 0.5 * claimed, (name, claimed, realised)


# -- hand-built traces ---------------------------------------------------------------------------------


class Blocks:
    """A TraceBuilder with a clock and block ids: alloc/free blocks in order."""

    def __init__(self) -> None:
        self.b = TraceBuilder()
        self.t = 0
        self.next_id = 1
        self.meta: dict[int, dict[str, object]] = {}

    def tick(self, dt: int = 10) -> int:
        self.t += dt
        return self.t

    def alloc(self, nbytes: int, **kw: object) -> int:
        bid = self.next_id
        self.next_id += 1
        self.meta[bid] = {"nbytes": nbytes, **kw}
        self.b.event(self.tick(), Action.ALLOC, bid, 0x1000 * bid, nbytes, **kw)  # type: ignore[arg-type]
        return bid

    def free(self, bid: int) -> None:
        m = dict(self.meta[bid])
        nbytes = m.pop("nbytes")
        self.b.event(self.tick(), Action.FREE, bid, 0x1000 * bid, nbytes, **m)  # type: ignore[arg-type]

    def build(self) -> Trace:
        return self.b.build()


def detect(module: object, trace: Trace, **thresholds: object) -> list[Finding]:
    pattern = {alignment_padding: "alignment-padding", kv_concat_growth: "kv-concat-growth"}[module]  # type: ignore[index]
    return module.detect(trace, Context(trace=trace, thresholds={pattern: thresholds}))  # type: ignore[attr-defined]


def _weights(tb: Blocks, nbytes: int = 1 << 20) -> int:
    return tb.alloc(nbytes, category=Category.WEIGHT, module="lm", op="aten::empty", written_bytes=0)


def test_alignment_padding_pad_to_power_of_two_with_downstream() -> None:
    tb = Blocks()
    _weights(tb)
    act = {"category": Category.ACTIVATION, "module": "fusion", "dtype": "float32"}
    # (4, 512, 64) float32 carrying 300 real positions per row
    padded = tb.alloc(4 * 512 * 64 * 4, op="aten::pad", shape=(4, 512, 64), written_bytes=4 * 300 * 64 * 4, **act)
    down = tb.alloc(4 * 512 * 256 * 4, op="aten::linear", shape=(4, 512, 256), written_bytes=-1, **act)
    tb.free(down)
    tb.free(padded)
    trace = tb.build()
    (f,) = detect(alignment_padding, trace)
    assert f.where == "fusion / aten::pad"
    pad_share = 1 - 300 / 512
    assert f.evidence["padded_bytes_at_peak"] == round(4 * 512 * 64 * 4 * pad_share)
    assert f.evidence["downstream_padded_bytes_at_peak"] == int(4 * 512 * 256 * 4 * pad_share)
    assert f.evidence["ratio"] == pytest.approx(512 / 300, abs=0.01)
    assert f.wasted_bytes == f.evidence["padded_bytes_at_peak"] + f.evidence["downstream_padded_bytes_at_peak"]
    assert "longest" in f.fix and "fusion" in f.fix
    # a stricter ratio threshold than 512/300 silences it
    assert detect(alignment_padding, trace, min_ratio=2.0) == []


def test_alignment_padding_cat_with_zeros_and_zeros_then_copy() -> None:
    tb = Blocks()
    _weights(tb)
    act = {"category": Category.ACTIVATION, "module": "projector", "dtype": "float32"}
    feats = tb.alloc(144 * 256 * 4, op="aten::linear", shape=(1, 144, 256), written_bytes=-1, **act)
    zeros = tb.alloc(432 * 256 * 4, op="aten::new_zeros", shape=(1, 432, 256), written_bytes=144 * 256 * 4, **act)
    slot = tb.alloc(576 * 256 * 4, op="aten::cat", shape=(1, 576, 256), written_bytes=576 * 256 * 4, **act)
    tb.free(zeros)
    buf = tb.alloc(576 * 256 * 4, op="aten::zeros", shape=(1, 576, 256), written_bytes=144 * 256 * 4,
                   **{**act, "module": "collate"})  # fmt: skip
    trace = tb.build()
    found = {f.where: f for f in detect(alignment_padding, trace)}
    assert set(found) == {"projector / aten::cat", "collate / aten::zeros"}  # the zeros input is part of the cat
    assert found["projector / aten::cat"].evidence["data_bytes"] == 144 * 256 * 4
    assert found["projector / aten::cat"].evidence["ratio"] == 4.0
    assert found["collate / aten::zeros"].evidence["padded_bytes_at_peak"] == 432 * 256 * 4
    del feats, slot, buf


def test_alignment_padding_expand_materialised() -> None:
    tb = Blocks()
    _weights(tb)
    tb.alloc(8 * 1024 * 4, op="aten::contiguous", shape=(8, 1024), written_bytes=1024 * 4, category=Category.TEMPORARY,
             module="attn", dtype="float32")  # fmt: skip
    (f,) = detect(alignment_padding, tb.build())
    assert f.evidence["ratio"] == 8.0 and "broadcast view" in f.fix


def test_alignment_padding_negatives() -> None:
    tb = Blocks()
    _weights(tb)
    act = {"category": Category.ACTIVATION, "module": "m", "dtype": "float32"}
    tb.alloc(4096, op="aten::pad", shape=(1, 32, 32), written_bytes=4000, **act)  # 2% padding: fine
    tb.alloc(4096, op="aten::full", shape=(1, 32, 32), written_bytes=0, **act)  # a constant (mask): not padding
    tb.alloc(4096, op="aten::zeros", shape=(1, 32, 32), written_bytes=-1, **act)  # unknown: not judged
    tb.alloc(4096, op="aten::linear", shape=(1, 32, 32), written_bytes=64, **act)  # not a padding op
    tb.alloc(1 << 16, op="aten::zeros", shape=(2, 8192), written_bytes=4096, category=Category.KV_CACHE,
             module="m", dtype="float32")  # fmt: skip  # a preallocated KV cache is not padding
    tb.alloc(4096, op="aten::cat", shape=(1, 32, 32), written_bytes=4096, **act)  # cat of real data
    assert detect(alignment_padding, tb.build()) == []
    assert detect(alignment_padding, TraceBuilder().build()) == []


def test_alignment_padding_not_live_at_peak_is_low() -> None:
    tb = Blocks()
    act = {"category": Category.TEMPORARY, "module": "collate", "dtype": "float32"}
    pad = tb.alloc(1 << 16, op="aten::pad", shape=(4, 64, 64), written_bytes=1 << 14, **act)
    tb.free(pad)
    _weights(tb)  # the peak comes later, without the padded block
    (f,) = detect(alignment_padding, tb.build())
    assert f.severity == "low" and f.evidence["padded_bytes_at_peak"] == 0
    assert f.wasted_bytes == f.evidence["max_padded_bytes_live"] == (1 << 16) - (1 << 14)


def _kv_block(n: int, layers: int = 2, kv_heads: int = 2, head_dim: int = 16) -> int:
    return kv_heads * n * head_dim * 4  # (1, kv_heads, n, head_dim) float32


def _grow_kv(tb: Blocks, steps: int, layers: int, whole_cache: bool, prompt: int = 64) -> None:
    """A cat-grown cache: per layer K and V of length n+1 made from length n. ``whole_cache``: every
    layer's new K/V is made before any old one is freed (a new list built while the old is referenced);
    otherwise each old block is freed right after its replacement (DynamicCache)."""
    live: dict[tuple[int, int], int] = {}
    for step in range(steps):
        n = prompt + step
        made = []
        for layer in range(layers):
            for kv in range(2):
                kw = {"category": Category.KV_CACHE, "module": f"lm.layers.{layer}.attn", "op": "aten::cat",
                      "dtype": "float32", "shape": (1, 2, n, 16), "written_bytes": _kv_block(n)}  # fmt: skip
                new = tb.alloc(_kv_block(n), **kw)
                old = live.get((layer, kv))
                live[(layer, kv)] = new
                if old is None:
                    continue
                if whole_cache:
                    made.append(old)
                else:
                    tb.free(old)
                # a rotate_half temporary of the same module, shape family and dtype
                tmp = tb.alloc(_kv_block(1), **{**kw, "category": Category.TEMPORARY, "shape": (1, 2, 1, 16)})
                tb.free(tmp)
        for old in made:
            tb.free(old)


def test_kv_concat_growth_whole_cache_doubled_is_high() -> None:
    tb = Blocks()
    _weights(tb, 64 * 1024)
    _grow_kv(tb, steps=32, layers=4, whole_cache=True)
    (f,) = detect(kv_concat_growth, tb.build())
    assert f.where == "lm.layers.*.attn / aten::cat"
    assert f.evidence["chains"] == 4 and f.evidence["decode_steps"] == 31  # one chain per layer: K and V
    # at the peak every layer's K and V exist at length 95 (old) and 96 (new)
    assert f.wasted_bytes == f.evidence["transient_bytes_at_peak"] == 8 * _kv_block(94)
    assert f.evidence["whole_cache_doubled"] and f.severity == "high"
    assert f.evidence["final_kv_bytes"] == 8 * _kv_block(95)
    assert f.evidence["kv_bytes_allocated"] == 8 * sum(_kv_block(64 + s) for s in range(32))
    assert "StaticCache" in f.fix and "static" in f.fix


def test_kv_concat_growth_layer_at_a_time_is_at_most_medium() -> None:
    tb = Blocks()
    _weights(tb, 16 * 1024)  # the cache dominates the peak, as in a long generation
    _grow_kv(tb, steps=32, layers=1, whole_cache=False)
    (f,) = detect(kv_concat_growth, tb.build())
    # one block (K or V of one layer) is doubled at a time
    assert f.wasted_bytes == _kv_block(94)
    assert not f.evidence["whole_cache_doubled"]
    assert f.wasted_bytes / summary(tb.build()).peak_bytes > 0.2 and f.severity == "medium"


def test_kv_concat_growth_negatives() -> None:
    tb = Blocks()
    _weights(tb)
    _grow_kv(tb, steps=3, layers=2, whole_cache=True)  # three lengths: below min_steps
    for n in range(40, 60):  # generated ids grow by cat too, but a (B, n) id tensor is not a cache
        tb.alloc(8 * n, category=Category.OTHER, op="aten::cat", dtype="int64", shape=(1, n), written_bytes=8 * n)
    for _ in range(10):  # same-length cats: nothing grows
        tb.alloc(4096, category=Category.ACTIVATION, module="m", op="aten::cat", dtype="float32", shape=(1, 64, 16),
                 written_bytes=4096)  # fmt: skip
    assert detect(kv_concat_growth, tb.build()) == []
    assert detect(kv_concat_growth, TraceBuilder().build()) == []
