"""Campaign limits from a device profile, the footprint the watchdog counts, and the budget a governed
worker fits under it (issue 17: a like-for-like campaign whose limits are not tuned to plain's peak)."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from memwarden.errors import InputError
from memwarden.models.devices import load_profile
from memwarden.resilience.config import load_config, parse_config
from memwarden.resilience.worker import resident_bytes

MiB = 1024**2
STRESS = Path(__file__).resolve().parents[1] / "examples" / "stress"
BASE = '[workload]\nscenario = "demo-chat"\n'


def test_rss_watchdog_from_a_device_profile_share() -> None:
    config = parse_config((BASE + '[limits]\ndevice = "iphone-13"\nshare = 0.25\ncount = "footprint"\n').encode())
    assert config.limits.rss_bytes == int(load_profile("iphone-13").usable_bytes * 0.25)
    assert config.limits.rss_counts == "footprint"
    whole = parse_config((BASE + '[limits]\ndevice = "pixel-8"\n').encode())  # share defaults to the whole limit
    assert whole.limits.rss_bytes == load_profile("pixel-8").usable_bytes
    assert whole.limits.rss_counts == "resident"


def test_shipped_stress_examples_share_one_derived_limit() -> None:
    """plain, fp32 governed and int4 governed run under the same watchdog, and it is the device profile's."""
    configs = {name: load_config(STRESS / f"{name}.toml") for name in ("plain", "governed-fp32", "governed")}
    limits = {c.limits for c in configs.values()}
    assert len(limits) == 1
    (limit,) = limits
    assert limit.rss_bytes == int(load_profile("iphone-13").usable_bytes * 0.33)
    assert limit.rss_counts == "footprint"
    assert configs["governed-fp32"].options.get("quantize") is None  # like for like: fp32 on both sides
    assert configs["governed"].options["quantize"] == 4 and "int4" in configs["governed"].name
    assert configs["governed-fp32"].fit_to_limits and not configs["plain"].fit_to_limits


@pytest.mark.parametrize(
    ("limits", "serving", "match"),
    [
        ('device = "no-such-phone"\n', "", "unknown device profile 'no-such-phone'; built-in: "),
        ('device = "../../etc/passwd"\n', "", "unknown device profile"),
        ('device = "iphone-13"\nrss = "600MiB"\n', "", "not both"),
        ('share = 0.5\nrss = "600MiB"\n', "", "give limits.device too"),
        ('device = "iphone-13"\nshare = 1.5\n', "", "limits.share"),
        ('device = "iphone-13"\nshare = true\n', "", "limits.share"),
        ('rss = "600MiB"\ncount = "pss"\n', "", "limits.count: must be one of resident, footprint"),
        ('rss = "600MiB"\n', "fit_to_limits = true\n", "only a governed session"),
        ("", 'mode = "governed"\nfit_to_limits = true\n', "needs an RSS watchdog"),
        ('rss = "600MiB"\n', 'mode = "governed"\nfit_to_limits = "yes"\n', "serving.fit_to_limits"),
    ],
)
def test_bad_limit_keys_are_one_clear_error(limits: str, serving: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        parse_config((BASE + f"[serving]\n{serving}[limits]\n{limits}").encode(), label="c.toml")


def test_footprint_counts_anonymous_and_shared_memory_not_file_pages(tmp_path) -> None:
    """The jitter's chunk (shared anonymous memory) counts in the footprint; a mapped file that was read
    (libraries, streamed weights) counts in the resident set only."""
    chunk = mmap.mmap(-1, 64 * MiB)  # what inject.Jitter maps: MAP_SHARED | MAP_ANONYMOUS
    before = resident_bytes("self", "footprint")
    chunk.write(b"\1" * (64 * MiB))
    assert resident_bytes("self", "footprint") - before >= 60 * MiB
    chunk.close()
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\2" * (64 * MiB))
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        rss, footprint = resident_bytes("self"), resident_bytes("self", "footprint")
        assert sum(mapped[i] for i in range(0, 64 * MiB, mmap.PAGESIZE)) == 2 * (64 * MiB // mmap.PAGESIZE)
        assert resident_bytes("self") - rss >= 60 * MiB
        assert resident_bytes("self", "footprint") - footprint < 8 * MiB


def test_fit_budget_leaves_the_session_what_the_watchdog_leaves() -> None:
    """limit - (what the process holds beside the model's tensors) - another app's chunk - margin,
    capped at the configured budget."""
    from memwarden.models import zoo
    from memwarden.resilience.worker import _FIT_MARGIN_BYTES, _Injected, _state_bytes, fit_budget

    model = zoo.build_model("llava", size="tiny", seed=0)
    weights = _state_bytes(model)
    assert weights > 0
    injected = _Injected({"inject": ["jitter:size=96MiB,period=15ms"], "budget_bytes": 4096 * MiB})
    fit = fit_budget(model, injected, 1500 * MiB, "footprint")
    footprint = resident_bytes("self", "footprint")
    assert fit["pressure_bytes"] == 96 * MiB and fit["counts"] == "footprint"
    assert fit["other_bytes"] == pytest.approx(footprint - weights, abs=16 * MiB)
    assert fit["budget_bytes"] == 1500 * MiB - fit["other_bytes"] - 96 * MiB - _FIT_MARGIN_BYTES
    capped = fit_budget(model, _Injected({"inject": [], "budget_bytes": 8 * MiB}), 1500 * MiB, "footprint")
    assert capped["budget_bytes"] == 8 * MiB and capped["pressure_bytes"] == 0
    assert not injected.jitters  # sizing starts no jitter: it starts with serving
