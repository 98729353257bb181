"""``--fit BUDGET --solve ...``: the answer fits the budget and the next step up does not, on the
same estimator; a device's kill limit is the budget when a device is given."""

from __future__ import annotations

import pytest

from memwarden.errors import InputError
from memwarden.estimate.run import estimate


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
    kwargs = {"prompt-tokens": {"prompt_tokens": fit["value"]}, "batch": {"batch": fit["value"]},
              "image": {"images": [(fit["value"], fit["value"])], "max_pixels": fit["value"] ** 2}}[solve]  # fmt: skip
    again = estimate(model, **{"prompt_tokens": 64, "new_tokens": 4, **kwargs})
    assert again.peak_bytes == fit["peak_bytes"]  # the answer is what the plain estimate says
    assert set(card.to_json()["fit"]) >= {"solve", "value", "peak_bytes", "budget_bytes", "next_value",
                                          "next_peak_bytes", "settings"}  # fmt: skip


def test_nothing_fits_is_one_clear_error() -> None:
    with pytest.raises(InputError, match="not even"):
        estimate("qwen2-vl", fit=1024, solve="prompt-tokens")


def test_fit_needs_solve() -> None:
    with pytest.raises(InputError, match="go together"):
        estimate("qwen2-vl", fit="1GiB")
