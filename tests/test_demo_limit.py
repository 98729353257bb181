"""`memwarden demo --real-limit`: under a real address-space limit (RLIMIT_AS in a child process) plain
generate() fails with the allocator's own out-of-memory, caught and shown, where the GovernedSession answers."""

from __future__ import annotations

import dataclasses

from memwarden.demo import LimitedResult, run_limited
from memwarden.models.chat import DEMO_DEVICE_BUDGET_BYTES, DEMO_TURNS, DemoConfig

MiB = 1024**2


def test_plain_fails_where_the_governed_session_answers_under_a_real_limit() -> None:
    # 190 MiB: the fp32 weights (180 MiB) leave plain generate() too little for its first turn (measured:
    # the process needs 205-210 MiB there, from run to run); the session quantizes the weights under the
    # same limit and answers every turn. (At 210 MiB plain answered both short turns in some runs.)
    config = DemoConfig(budget_bytes=190 * MiB, turns=2, new_tokens=4)
    result = run_limited(config, arms=("plain", "governed-int4"))
    assert result.limit_bytes > 0
    assert result.plain_answered < config.turns and result.plain_error is not None
    assert "allocate" in result.plain_error or "MemoryError" in result.plain_error, result.plain_error
    assert result.int4_ran and result.int4_error is None and result.int4_answered == config.turns
    assert "plain generate() failed at turn" in result.story and "int4 weights" in result.story
    assert f"answered all {config.turns}" in result.story


def test_the_demos_device_budget_fails_plain_and_the_fp32_session_answers() -> None:
    """What `memwarden demo` shows by default, like with like (fp32 weights on both sides): plain
    generate() fails under the real limit (measured: the process needs 205-207 MiB by its first
    answer), the session streams what does not fit and answers every turn with the same tokens."""
    config = DemoConfig(budget_bytes=DEMO_DEVICE_BUDGET_BYTES, turns=DEMO_TURNS)
    result = run_limited(config, arms=("plain", "governed"))
    assert result.plain_error is not None and result.plain_answered < config.turns, result.story
    assert result.governed_error is None and result.governed_answered == config.turns, result.story
    assert result.outputs_equal and result.governed_degraded == 0 and not result.int4_ran
    assert result.story.startswith(
        f"under a real {DEMO_DEVICE_BUDGET_BYTES // MiB}.0 MiB limit plain generate() failed"
    )


def test_story_says_which_side_failed() -> None:
    base = {"budget_bytes": 210 * MiB, "limit_bytes": 1 << 30, "turns": 3, "outputs_equal": True}
    plain_fails = LimitedResult(
        **base,
        plain_answered=1,
        plain_error="RuntimeError: can't allocate memory",
        governed_answered=3,
        governed_error=None,
    )
    assert plain_fails.story.startswith("under a real 210.0 MiB limit plain generate() failed at turn 2")
    assert plain_fails.story.endswith("answered all 3, the tokens plain gives without a limit")
    differs = dataclasses.replace(plain_fails, outputs_equal=False)
    assert differs.story.endswith("answered all 3, but NOT plain's tokens")
    both_fail = LimitedResult(
        **base,
        plain_answered=0,
        plain_error="MemoryError",
        governed_answered=0,
        governed_error="MemoryError",
        int4_ran=True,
        int4_error="MemoryError",
    )
    assert "failed at turn 1 too" in both_fail.story and "with int4 weights MemoryError" in both_fail.story
    fits = LimitedResult(**base, plain_answered=3, plain_error=None, governed_answered=3, governed_error=None)
    assert fits.story.startswith("both fit")
