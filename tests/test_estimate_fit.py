"""``--fit BUDGET --solve ...``: the answer fits the budget and the next step up does not, on the
same estimator; a device's kill limit is the budget when a device is given."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memwarden.errors import InputError
from memwarden.estimation.fit import _Probes, _search
from memwarden.estimation.resolve import resolve_model
from memwarden.estimation.run import estimate


@pytest.mark.parametrize(("model", "solve"), [("qwen2-vl", "prompt-tokens"), ("llava", "batch"), ("qwen2-vl", "image")])
def test_answer_fits_and_next_step_does_not(model: str, solve: str) -> None:
    small = estimate(model, prompt_tokens=64, new_tokens=4)
    budget = small.peak_bytes + 3 * (small.peak_bytes - small.weights_bytes)  # room for a few steps more
    card = estimate(model, prompt_tokens=64, new_tokens=4, fit=budget, solve=solve)
    fit = card.fit
    assert fit is not None and fit["solve"] == solve and fit["budget_bytes"] == budget
    assert fit["peak_bytes"] == card.peak_bytes <= budget
    assert fit["next_value"] is not None and fit["next_value"] > fit["value"]
    assert fit["next_peak_bytes"] is None or fit["next_peak_bytes"] > budget
    kwargs = {
        "prompt-tokens": {"prompt_tokens": fit["value"]},
        "batch": {"batch": fit["value"]},
        "image": {"images": [(fit["value"], fit["value"])], "max_pixels": fit["value"] ** 2},
    }[solve]
    again = estimate(model, **{"prompt_tokens": 64, "new_tokens": 4, **kwargs})
    assert again.peak_bytes == fit["peak_bytes"]  # the answer is what the plain estimate says
    assert set(card.to_json()["fit"]) >= {
        "solve",
        "value",
        "peak_bytes",
        "budget_bytes",
        "next_value",
        "next_peak_bytes",
        "settings",
    }


def test_nothing_fits_is_one_clear_error() -> None:
    with pytest.raises(InputError, match="not even"):
        estimate("qwen2-vl", fit=1024, solve="prompt-tokens")


def test_fit_needs_solve() -> None:
    with pytest.raises(InputError, match="go together"):
        estimate("qwen2-vl", fit="1GiB")


# -- the search itself: pure, on curves whose answer is known ------------------------------------


def _solve(
    curve: list[int], budget: int, refuse_above: int | None, cap: int | None, quadratic: bool, checks: bool = False
) -> tuple[int, int | None, _Probes, int]:
    """(lo, hi, the probes, how many estimates) of the search on a known curve (curve[k - 1]: the
    peak of k steps; above ``refuse_above`` the model refuses); ``checks``: acceptance can be
    checked without an estimate."""
    calls: list[int] = []

    def peak(k: int) -> int | None:
        calls.append(k)
        return None if refuse_above is not None and k > refuse_above else curve[k - 1]

    def accepts(k: int) -> bool:
        return refuse_above is None or k <= refuse_above

    probes = _Probes(peak, budget, accepts if checks else None)
    assert probes.fits(1)
    lo, hi = _search(probes, len(curve), cap, quadratic=quadratic)
    assert len(calls) == len(set(calls)), "a step count estimated twice"
    return lo, hi, probes, len(calls)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(st.integers(0, 1 << 20), min_size=1, max_size=600),
    budget_at=st.floats(0, 1),
    refuse_at=st.one_of(st.none(), st.integers(1, 600)),
    cap_error=st.one_of(st.none(), st.integers(-5, 5)),
    quadratic=st.booleans(),
    checks=st.booleans(),
)
def test_search_finds_the_boundary_of_any_monotone_curve(
    steps: list[int], budget_at: float, refuse_at: int | None, cap_error: int | None, quadratic: bool, checks: bool
) -> None:
    curve = [1000]
    for d in steps:
        curve.append(curve[-1] + d)
    refuse = refuse_at if refuse_at is not None and refuse_at < len(curve) else None
    accepted = curve[: refuse or len(curve)]
    budget = accepted[0] + int(budget_at * (accepted[-1] - accepted[0]))
    cap = None if cap_error is None or refuse is None else max(1, refuse + cap_error)
    lo, hi, probes, _ = _solve(curve, budget, refuse, cap, quadratic, checks)
    assert curve[lo - 1] <= budget and lo in probes.peaks
    if hi is None:
        assert lo == len(curve)
    else:
        assert hi == lo + 1 and (hi in probes.refused or probes.peaks[hi] > budget)
    truth = max(k for k in range(1, len(accepted) + 1) if accepted[k - 1] <= budget)
    assert lo == truth


@pytest.mark.parametrize("quadratic", [False, True])
@pytest.mark.parametrize("where", [0.07, 0.3, 0.61, 0.97])
def test_search_on_a_straight_curve_takes_at_most_four_estimates(quadratic: bool, where: float) -> None:
    """A real model's peak is a line in the solved tokens (an image's grow with its area); the old
    secant crept up from below and took 5 to 22 estimates where these take 3 or 4."""
    top = 512
    curve = [10_000_000 + 4_096 * (k * k if quadratic else k) for k in range(1, top + 1)]
    budget = curve[0] + int(where * (curve[-1] - curve[0]))
    lo, hi, _, runs = _solve(curve, budget, None, None, quadratic)
    assert curve[lo - 1] <= budget < curve[lo] and hi == lo + 1
    assert runs <= 4


def test_search_reaches_the_context_limit_in_four_estimates() -> None:
    """Past the context the model refuses (and a refusal costs the processor and the encoder): no
    guess goes past the predicted limit before it has run, so a budget beyond it takes the first
    step, the slope probe, the limit and the refused step above it."""
    curve = [10_000_000 + 4_096 * k * k for k in range(1, 513)]
    lo, hi, probes, runs = _solve(curve, 1 << 40, 180, 180, True)
    assert (lo, hi, runs) == (180, 181, 4) and probes.refused == {181}
    assert min(probes.peaks) == 1 and sorted(probes.peaks)[1] <= 16  # the slope came from a cheap image


def test_a_limit_other_than_memory_is_found_by_acceptance_checks() -> None:
    """A limit the context cap does not predict (Qwen2-VL's prompt has room for the begin/end
    markers of 64 images, not 65) with memory to spare: the refusal's edge is found by acceptance
    checks, which build the request without running it, and only the edge is estimated."""
    curve = [10_000_000 + 4_096 * k for k in range(1, 513)]
    lo, hi, probes, runs = _solve(curve, 1 << 40, 64, None, False, checks=True)
    assert (lo, hi) == (64, 65) and 65 in probes.refused
    assert runs <= 4 and probes.checked
    lo2, hi2, _, runs_without = _solve(curve, 1 << 40, 64, None, False)
    assert (lo2, hi2) == (64, 65) and runs_without > runs


# -- on the real estimator ----------------------------------------------------------------------


def test_image_solve_stops_at_the_context_and_prints_what_the_processor_needs() -> None:
    """The zoo qwen2-vl takes 4096 positions: with room for any image, the answer is the largest
    side whose placeholders fit the context, found in four estimates; its printed max_pixels,
    given to transformers' own Qwen2-VL image processor, makes exactly the tokens the card counted."""
    from transformers import Qwen2VLImageProcessorPil

    card = estimate("qwen2-vl", prompt_tokens=64, new_tokens=4, fit="64GiB", solve="image")
    fit = card.fit
    assert fit is not None and fit["estimates_run"] <= 4
    assert fit["next_refused"] and "context" in fit["next_refused"]
    side = fit["value"]
    assert 64 + 4 + card.tokens["vision"] <= 4096 < 64 + 4 + (side // 28 + 1) ** 2
    printed = re.search(r"max_pixels=(\d+)", fit["settings"]["processor kwargs"])
    assert printed is not None and int(printed.group(1)) == side * side
    vc = resolve_model("qwen2-vl").config.vision_config
    processor = Qwen2VLImageProcessorPil(
        max_pixels=int(printed.group(1)), patch_size=vc.patch_size, merge_size=vc.spatial_merge_size
    )
    for w, h in ((side, side), (2 * side, 2 * side), (3 * side, side)):
        grid = processor(images=[np.zeros((h, w, 3), dtype=np.uint8)], return_tensors="pt")["image_grid_thw"][0]
        tokens = int(grid.prod()) // vc.spatial_merge_size**2
        if (w, h) == (side, side):
            assert tokens == card.tokens["vision"]
        assert tokens <= card.tokens["vision"]  # a larger photo is scaled into the same budget


def test_frames_solve_fits_and_the_next_temporal_patch_does_not() -> None:
    small = estimate("qwen2-vl", prompt_tokens=64, new_tokens=4, videos=[(56, 56, 2)])
    budget = small.peak_bytes + 3 * (small.peak_bytes - small.weights_bytes)
    card = estimate("qwen2-vl", prompt_tokens=64, new_tokens=4, videos=[(56, 56, 2)], fit=budget, solve="frames")
    fit = card.fit
    assert fit is not None and fit["value"] % 2 == 0 and fit["next_value"] == fit["value"] + 2  # temporal patch 2
    assert card.peak_bytes == fit["peak_bytes"] <= budget < fit["next_peak_bytes"]
    again = estimate("qwen2-vl", prompt_tokens=64, new_tokens=4, videos=[(56, 56, fit["value"])])
    assert again.peak_bytes == fit["peak_bytes"]
    assert f"num_frames={fit['value']}" in fit["settings"]["transformers"]


def test_frames_solve_refuses_a_family_without_video_naming_why() -> None:
    with pytest.raises(InputError, match="no video processor for model_type 'llava'"):
        estimate("llava", fit="64GiB", solve="frames")


def test_a_budget_under_the_weights_is_refused_before_any_request_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from memwarden.estimation import fit as fit_module

    card = estimate("qwen2-vl", prompt_tokens=64, new_tokens=4)

    def no_request(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a request was run")

    monkeypatch.setattr(fit_module, "card_for", no_request)
    with pytest.raises(InputError, match=rf"not even the weights \({card.weights_bytes} bytes\)"):
        estimate("qwen2-vl", prompt_tokens=64, new_tokens=4, fit=card.weights_bytes - 1, solve="batch")
