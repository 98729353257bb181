"""The pytest plugin, driven through pytest's own ``pytester``: real pytest runs in subprocesses
(the plugin comes from the installed ``pytest11`` entry point), on a real zoo model.

The limits sit between two figures of the same run that differ by a wide margin (the vision
tower's bytes in encode, activations included, vs in decode, weights only), measured on the same
workload in a fresh process as pytester's are, so which side of a limit a test falls on does not
depend on what else this process holds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memwarden.analyze.check import measure, parse_limit
from memwarden.trace.io import load
from memwarden.units import format_bytes

pytest_plugins = ["pytester"]

WORKLOAD = """
import pytest
import torch

from memwarden.models import zoo


@pytest.fixture(scope="module")
def model():
    return zoo.build_model("qwen2-vl")


def serve(model):
    inputs = zoo.make_inputs(model, image_size=(224, 224))
    with torch.no_grad():
        model.generate(**inputs, **zoo.generate_kwargs("qwen2-vl"), max_new_tokens=2)
"""


FIGURES = """
import json
import torch
import memwarden
from memwarden.analyze.check import measure, parse_limit
from memwarden.models import zoo

model = zoo.build_model("qwen2-vl")
inputs = zoo.make_inputs(model, image_size=(224, 224))
with memwarden.capture() as cap, torch.no_grad():
    model.generate(**inputs, **zoo.generate_kwargs("qwen2-vl"), max_new_tokens=2)
scopes = ("encode.vision", "decode.vision", "vision", "text")
print(json.dumps({s: measure(cap.trace, parse_limit(f"{s}=1")).measured_bytes for s in scopes}))
"""


@pytest.fixture(scope="module")
def figures() -> dict[str, int]:
    """The figures the generated tests' limits are placed between, from the same workload in a
    fresh process like pytester's: every model alive in a process counts as alive from the start,
    so this test process (other tests' models) would measure more."""
    done = subprocess.run([sys.executable, "-c", FIGURES], capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _between(low: int, high: int) -> int:
    assert high > low * 1.2, (low, high)  # the margin that makes the outcome independent of the process
    return (low + high) // 2


def test_limits_hold_or_fail_with_the_explanation(
    pytester: pytest.Pytester, figures: dict[str, int], tmp_path: Path
) -> None:
    phase_limit = _between(figures["decode.vision"], figures["encode.vision"])
    modality_limit = _between(figures["vision"], figures["text"])
    pytester.makepyfile(
        WORKLOAD
        + f"""

@pytest.mark.memwarden(peak={phase_limit}, phase="decode", modality="vision")
def test_decode_holds(model):
    serve(model)


@pytest.mark.memwarden(peak="{phase_limit}B", phase="encode", modality="vision")
def test_encode_breaks(model):
    serve(model)


@pytest.mark.memwarden(peak={modality_limit}, modality="vision")
def test_vision_holds(model):
    serve(model)


@pytest.mark.memwarden("text={modality_limit}")
def test_text_breaks(model):
    serve(model)


@pytest.mark.memwarden(peak="1 TiB", allocated="1 TiB")
def test_generous_holds(model):
    serve(model)


@pytest.mark.memwarden(peak="lots")
def test_bad_marker(model):
    serve(model)


def test_fixture_block(model, memwarden_limits):
    with memwarden_limits.watch(peak={phase_limit}, phase="decode", modality="vision"):
        serve(model)
    assert memwarden_limits.trace is not None
    with memwarden_limits.watch("encode.vision={phase_limit}"):
        serve(model)
    raise AssertionError("not reached: the second block breaks its limit")
"""
    )
    kept = tmp_path / "kept"
    # Under pytest-xdist with two workers (one run covers both: the workers run the tests, the
    # controller prints their reports); -rf: a short summary of the failures only.
    result = pytester.runpytest_subprocess("-n", "2", "--memwarden-traces", str(kept), "-p", "no:cacheprovider", "-rf")
    result.assert_outcomes(passed=3, failed=4)
    result.stdout.fnmatch_lines(["created: 2/2 workers"])
    out = result.stdout.str()
    failed = set(re.findall(r"^FAILED \S+::(\w+)", out, re.MULTILINE))
    assert failed == {"test_encode_breaks", "test_text_breaks", "test_bad_marker", "test_fixture_block"}, out
    result.stdout.fnmatch_lines(
        [
            "*_ test_encode_breaks _*",
            f"memory limit exceeded: peak encode.vision {format_bytes(figures['encode.vision'])[:-5]}*"
            f" > limit {format_bytes(phase_limit)} *",
            "  top lines at the peak:",
            "*test_limits_hold_or_fail_with_the_explanation.py:*:serve",
            f"trace kept: {kept}*test_encode_breaks.mwtrace",
        ]
    )
    result.stdout.fnmatch_lines(
        ["*_ test_text_breaks _*", f"memory limit exceeded: peak text * > limit {format_bytes(modality_limit)} *"]
    )
    result.stdout.fnmatch_lines(["*_ test_bad_marker _*", "@pytest.mark.memwarden: not a byte quantity: 'lots'*"])
    result.stdout.fnmatch_lines(["*_ test_fixture_block _*", "memory limit exceeded: peak encode.vision *"])
    assert "not reached" not in out
    assert "During handling of the above exception" not in out  # the bad marker fails in one line

    traces = sorted(p.name for p in kept.iterdir())
    assert len(traces) == 3  # the breaches only; the passing tests and the bad marker keep nothing
    assert [t for t in traces if "test_encode_breaks" in t] and [t for t in traces if "-block2" in t]
    trace = load(next(kept.glob("*test_encode_breaks.mwtrace")))
    assert measure(trace, parse_limit("encode.vision=1")).measured_bytes > phase_limit
