"""issue 44, "one source of truth for fits": ``--fit``/``--solve`` and ``--sweep`` judge every value
as the plain estimate does (``MemoryCard.fits_in``: on a CUDA device the allocator's reserved peak,
workspaces and reserve included), so every answer ``--fit`` gives, given back to ``estimate`` with
the same device, fits, and the next step up does not.

Before, the search compared the tensors' peak: Qwen2-VL-2B-Instruct (its published processor) on a
Jetson Orin Nano 8GB was answered "largest image that fits: 3192 px ... fits (35 MiB headroom)",
where ``estimate --image 3192x3192`` on the same device said "allocator reserve 2.0 GiB -> reserved
peak 8.4 GiB ... does not fit (2.0 GiB over)"."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from memwarden.commands import estimate as estimate_command
from memwarden.errors import InputError
from memwarden.estimation.run import estimate, sweep
from memwarden.models.devices import load_profile

# Shipped models whose meta estimate takes about a second (text-only requests, so a batch of
# hundreds builds no images), on a unified-memory CUDA board, a discrete CUDA card and a CPU-only
# board: the CUDA ones add the allocator's reserve to the verdict, the CPU one does not.
MODELS = ("qwen2.5-0.5b-instruct", "smolvlm-256m-instruct")
DEVICES = ("jetson-orin-nano-8gb", "rtx-4060-8gb", "raspberry-pi-5-8gb")
SOLVES = ("batch", "prompt-tokens")


def _request(base: dict[str, Any], solve: str, value: int) -> dict[str, Any]:
    """The estimate() arguments of ``base`` with the solved setting at ``value``, as --fit prints it."""
    if solve == "image":
        return {**base, "images": [(value, value)], "max_pixels": value * value}
    if solve == "images":
        return {**base, "images": [base["images"][0]] * value}
    field = {"batch": "batch", "prompt-tokens": "prompt_tokens", "new-tokens": "new_tokens"}[solve]
    return {**base, field: value}


def _answer_fits_and_next_does_not(model: str, device: str, solve: str, base: dict[str, Any]) -> dict[str, Any]:
    card = estimate(model, fit=device, solve=solve, **base)
    fit = card.fit
    assert fit is not None and card.device_id == device and card.fits is True
    answer = estimate(model, device=device, suggest=False, **_request(base, solve, fit["value"]))
    assert answer.fits is True, (
        f"--fit answered {fit['value']}, estimate says: {answer.verdict(answer.usable_bytes or 0)}"
    )
    assert answer.device_peak_bytes == fit["peak_bytes"] <= answer.usable_bytes == fit["budget_bytes"]
    if fit["next_value"] is None:  # the largest value the model takes at all
        return fit
    up = _request(base, solve, fit["next_value"])
    if fit.get("next_refused"):
        with pytest.raises(InputError):
            estimate(model, device=device, suggest=False, **up)
    else:
        above = estimate(model, device=device, suggest=False, **up)
        assert above.fits is False and above.device_peak_bytes == fit["next_peak_bytes"] > fit["budget_bytes"]
    return fit


# no shrinking: a failing example would cost dozens of estimates to shrink
@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.generate],
)
@given(
    model=st.sampled_from(MODELS),
    device=st.sampled_from(DEVICES),
    solve=st.sampled_from(SOLVES),
    prompt_tokens=st.sampled_from((32, 256)),
    new_tokens=st.sampled_from((1, 2)),
)
def test_fit_answers_fit_by_estimate_and_the_next_step_does_not(
    model: str, device: str, solve: str, prompt_tokens: int, new_tokens: int
) -> None:
    _answer_fits_and_next_does_not(model, device, solve, {"prompt_tokens": prompt_tokens, "new_tokens": new_tokens})


# The media a user solves for, on shipped vision models (slow: tens of seconds of meta estimates each):
# the issue's own case (Qwen2-VL-2B-Instruct's published processor, the largest image on a Jetson
# Orin Nano), how many images LLaVA-OneVision takes (several images are each their base view), and
# generated tokens on a CPU-only board.
MEDIA_CASES = [
    ("Qwen/Qwen2-VL-2B-Instruct", "jetson-orin-nano-8gb", "image", {"images": [(448, 448)]}),
    ("llava-onevision-qwen2-0.5b-ov", "jetson-orin-nano-8gb", "images", {"images": [(384, 384)]}),
    ("qwen2.5-0.5b-instruct", "raspberry-pi-5-8gb", "new-tokens", {"batch": 64}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "device", "solve", "media"), MEDIA_CASES)
def test_media_and_generation_fits_answer_fit_by_estimate(
    model: str, device: str, solve: str, media: dict[str, Any]
) -> None:
    _answer_fits_and_next_does_not(model, device, solve, {"prompt_tokens": 32, "new_tokens": 1, **media})


def test_a_cuda_fit_compares_the_reserved_peak() -> None:
    """On a CUDA device the answer's reserved peak is what fits; its tensors alone are smaller."""
    fit = _answer_fits_and_next_does_not(
        "qwen2.5-0.5b-instruct", "rtx-4060-8gb", "batch", {"prompt_tokens": 64, "new_tokens": 1}
    )
    assert fit["compared"] == "reserved_peak_bytes" and fit["tensor_peak_bytes"] < fit["peak_bytes"]


def test_sweep_verdicts_are_the_plain_estimates() -> None:
    """A sweep's "fits" per point and device is the card estimate() makes on that device."""
    devices = [load_profile(d) for d in ("rtx-4060-8gb", "raspberry-pi-5-8gb")]
    prompts = [32, 2048]
    result = sweep("qwen2.5-0.5b-instruct", prompt_tokens=prompts, new_tokens=1, batch=64, devices=devices)
    data = result.to_json()
    for i, prompt in enumerate(prompts):
        for d in devices:
            plain = estimate(
                "qwen2.5-0.5b-instruct", prompt_tokens=prompt, new_tokens=1, batch=64, device=d, suggest=False
            )
            point = data["axes"]["prompt_tokens"][i]["devices"][d.id]
            assert point == {"fits": plain.fits, "peak_bytes": plain.device_peak_bytes}
            assert result.fits("prompt_tokens", i, d) is plain.fits


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="memwarden")
    estimate_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["estimate", *argv])
    return int(args.func(args))


def test_cli_fit_json_keeps_the_verdict_and_its_answer_fits_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["smolvlm-256m-instruct", "--prompt-tokens", "64", "--new-tokens", "1", "--quiet"]
    assert _cli(*argv, "--fit", "jetson-orin-nano-8gb", "--solve", "batch", "--json") == 0
    card = json.loads(capsys.readouterr().out)
    assert card["fits"] is True and card["fit"]["compared"] == "reserved_peak_bytes"
    batch = str(card["fit"]["value"])
    assert _cli(*argv, "--batch", batch, "--device-profile", "jetson-orin-nano-8gb", "--json", "--no-suggest") == 0
    assert json.loads(capsys.readouterr().out)["fits"] is True
    up = str(card["fit"]["next_value"])
    assert _cli(*argv, "--batch", up, "--device-profile", "jetson-orin-nano-8gb", "--json", "--no-suggest") == 1
    assert json.loads(capsys.readouterr().out)["fits"] is False


def test_fit_and_device_profile_naming_two_devices_is_refused() -> None:
    with pytest.raises(InputError, match="give one device"):
        estimate("smolvlm-256m-instruct", fit="jetson-orin-nano-8gb", solve="batch", device="rtx-4060-8gb")


@pytest.mark.parametrize(
    ("budget", "prompt", "compared"),
    # under the 489 MiB of weights; over them, under batch 1's peak (662 MiB with 4000 prompt tokens)
    [("100MiB", "64", "weights_bytes"), ("500MiB", "4000", "peak_bytes")],
)
def test_fit_that_finds_nothing_is_a_verdict_exit_1_with_json_kept(
    capsys: pytest.CaptureFixture[str], budget: str, prompt: str, compared: str
) -> None:
    """Nothing fits is "does not fit", as a plain estimate's: exit 1 (2 is for bad input) and, with
    --json, the verdict on stdout (fits false, no value); the reason also as one line on stderr."""
    from memwarden.cli import main

    argv = ["estimate", "smolvlm-256m-instruct", "--prompt-tokens", prompt, "--new-tokens", "1", "--fit", budget]
    assert main([*argv, "--solve", "batch", "--json"]) == 1
    out = capsys.readouterr()
    card = json.loads(out.out)
    assert card["fits"] is False and card["fit"]["value"] is None and card["fit"]["compared"] == compared
    assert card["fit"]["peak_bytes"] > card["fit"]["budget_bytes"]
    # (transformers' own warnings may come before it, from its logger)
    assert out.err.splitlines()[-1].startswith("memwarden estimate: error: not even")
    assert main([*argv, "--solve", "batch", "--quiet"]) == 1
    assert "not even" in capsys.readouterr().err
