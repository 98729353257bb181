"""`memwarden stress --sweep`: the swept parameter's points, the injections at each, the Wilson
interval of a failure rate, and the page that plots both curves."""

from __future__ import annotations

import re

import pytest

from memwarden.errors import InputError
from memwarden.resilience.inject import parse_inject
from memwarden.resilience.report import render_sweep_html
from memwarden.resilience.sweep import parse_sweep, wilson_interval


def test_jitter_sweep_points_and_injections():
    sweep = parse_sweep("jitter:size=0..256MiB:5")
    assert sweep.values == tuple(float(i * 64 * 2**20) for i in range(5))
    other = "squeeze:at=2s,to=60%"
    assert sweep.injections(0.0, ["jitter:size=128MiB,period=20ms", other]) == [other]  # no chunk at 0
    specs = sweep.injections(64 * 2**20, ["jitter:size=128MiB,period=20ms,hold=5ms", other])
    assert specs[0] == other and specs[1] == f"jitter:period=20ms,hold=5ms,size={64 * 2**20}"
    jitter = parse_inject(specs[1])
    assert jitter.size_bytes == 64 * 2**20  # type: ignore[union-attr]
    assert sweep.injections(2**20, []) == [f"jitter:period=15ms,size={2**20}"]


def test_squeeze_and_limits_sweeps():
    squeeze = parse_sweep("squeeze:to=100%..40%:4")
    assert squeeze.values == (100.0, 80.0, 60.0, 40.0)
    assert [parse_inject(s[-1]).__class__.__name__ for s in (squeeze.injections(v, []) for v in squeeze.values)] == [
        "Squeeze"
    ] * 4
    limits = parse_sweep("limits:rss=800MiB..500MiB:4")
    assert limits.injections(limits.values[0], ["jitter:size=1MiB,period=15ms"]) == ["jitter:size=1MiB,period=15ms"]


@pytest.mark.parametrize(
    "text", ["jitter:size=0..256MiB", "jitter:period=1ms..5ms:3", "jitter:size=0..256MiB:1", "squeeze:to=0%..50%:3"]
)
def test_bad_sweeps_say_what_is_expected(text):
    with pytest.raises(InputError, match="--sweep"):
        parse_sweep(text)


def test_wilson_interval_holds_the_rate_and_stays_in_bounds():
    assert wilson_interval(0, 40)[0] == 0.0 and 0 < wilson_interval(0, 40)[1] < 0.1
    low, high = wilson_interval(20, 40)
    assert low < 0.5 < high and high - low < 0.35
    assert wilson_interval(40, 40)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    wide, narrow = wilson_interval(3, 6), wilson_interval(30, 60)
    assert wide[1] - wide[0] > narrow[1] - narrow[0]


def test_sweep_page_plots_both_curves():
    def side(failed, n=6):
        lo, hi = wilson_interval(failed, n)
        return {
            "requests": n,
            "failed": failed,
            "rate": failed / n,
            "low": lo,
            "high": hi,
            "ok": n - failed,
            "oom": failed,
            "crash": 0,
            "lost": 0,
            "peak_rss_max_bytes": None,
        }

    points = [
        {
            "value": v * 2**20,
            "label": f"{v} MiB",
            "inject": [],
            "rss_limit_bytes": None,
            "a": side(fa),
            "b": side(0),
            "failure_rate_p_value": 1.0,
        }
        for v, fa in ((0, 0), (128, 2), (256, 6))
    ]
    data = {
        "sweep": "jitter:size=0..256MiB:3",
        "kind": "jitter",
        "key": "size",
        "unit": "bytes",
        "runs": 6,
        "seed": 0,
        "inject": [],
        "a_name": "plain",
        "b_name": "governed",
        "points": points,
    }
    html = render_sweep_html(data)
    curves = dict(re.findall(r'class="curve-(a|b)" points="([^"]+)"', html))
    assert set(curves) == {"a", "b"}
    ys = {s: [float(p.split(",")[1]) for p in curves[s].split()] for s in curves}
    assert ys["a"][0] > ys["a"][1] > ys["a"][2]  # plain's rate rises (SVG y grows downwards)
    assert len(set(ys["b"])) == 1  # the governed side flat at 0
    assert "6/6" in html and "<script" not in html
