"""A GovernedSession following a replayed device-state log steps down before the kill limit (issue 46).

The log (tegrastats on a Jetson; MemAvailable, PSI and onTrimMemory on an Android phone) is replayed
one sample per request, by index: no clock, no thread. At each tick the kill limit is what the state
lets one more allocation get (``govern.device_state.obtainable``), scaled so that the first tick's
limit is 1.25x the model's weights. The session's budget (``govern.state_budget.StateBudget``) steps
down ahead of the limit; the session shrinks its KV pool and streams its weights (the admission
ladder) and serves every request, and what it holds plus each request's transient peak (measured
with the allocation recorder) stays under the limit at every tick. Plain ``model.generate`` on the
same requests, its memory counted the same way (weights plus the request's transient peak),
reaches the limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from memwarden.govern.state_budget import StateBudget, StepDownPolicy
from memwarden.models import zoo
from memwarden.record.live.capture import Capture
from memwarden.runtime.host_memory import state_bytes
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.session_config import SessionConfig
from memwarden.trace.model import Action

PRESSURE = Path(__file__).parent / "fixtures" / "device_state" / "pressure"
START_LIMIT_X_WEIGHTS = 1.25  # the log's first limit: the model fits with room to spare
NEW_TOKENS = 8


def _model() -> Any:
    """A zoo llava whose language model is deep enough (8 layers) for weight streaming to matter:
    the tiny zoo size is mostly embeddings and vision tower, which stay resident."""
    cfg = zoo.build_config("llava", "tiny")
    cfg.text_config.num_hidden_layers = 8
    cfg.text_config.intermediate_size = 8 * cfg.text_config.hidden_size
    return zoo.build_from_config("llava", cfg)


def _transient_peak(run: Any) -> tuple[Any, int]:
    """(run's result, the most bytes allocated during it beyond what was live at its start): the
    allocation recorder's alloc/free events, frees of earlier tensors (an old KV pool) included."""
    with Capture(record_ops=False, fingerprints=False, lines=False) as cap:
        out = run()
    ev = cap.trace.events
    sign = np.where(ev["action"] == int(Action.ALLOC), 1, np.where(ev["action"] == int(Action.FREE), -1, 0))
    live = np.cumsum(sign * ev["nbytes"].astype(np.int64))
    return out, int(max(0, live.max())) if len(live) else 0


@pytest.fixture(scope="module")
def served() -> dict[str, Any]:
    model = _model()
    gen = zoo.generate_kwargs("llava")
    requests = [zoo.make_inputs(model, prompt_tokens=24, seed=i) for i in range(8)]
    weights = state_bytes(model)
    plain, expected = [], []
    with torch.inference_mode():
        for x in requests:
            out, peak = _transient_peak(lambda x=x: model.generate(**x, max_new_tokens=NEW_TOKENS, **gen))
            plain.append(weights + peak)
            expected.append(out)
    return {"model": model, "gen": gen, "requests": requests, "weights": weights, "plain": plain, "expected": expected}


@pytest.mark.parametrize(
    ("log", "kind"), [("jetson_tegrastats_falling.txt", "cuda"), ("android_psi_trim_falling.txt", "host")]
)
def test_session_steps_down_before_the_kill_limit_and_serves_every_request(
    served: dict[str, Any], log: str, kind: str
) -> None:
    model, gen, requests, weights = served["model"], served["gen"], served["requests"], served["weights"]
    source = StateBudget.from_lines(
        (PRESSURE / log).read_text().splitlines(),
        policy=StepDownPolicy(kind=kind),
        start_limit_bytes=int(START_LIMIT_X_WEIGHTS * weights),
    )
    assert len(source.samples) == len(requests)  # one tick per request
    source.advance_to(0)
    # max_wait_s is admission's wall-clock limit on planning one request (it refuses past it): far above what
    # planning takes on a loaded machine, so no outcome here depends on timing (the budget never rises mid-request)
    config = SessionConfig(min_kv_tokens=64, max_wait_s=300.0)
    footprints, limits, budgets = [], [], []
    with torch.inference_mode(), GovernedSession(model, budget=source, config=config) as session:
        for tick, x in enumerate(requests):
            source.advance_to(tick)
            held = session.held_bytes  # what the session holds when the limit moves
            out, peak = _transient_peak(lambda x=x: session.generate(**x, max_new_tokens=NEW_TOKENS, **gen))
            footprints.append(held + peak)
            limits.append(source.limit_bytes)
            budgets.append(source.budget_bytes)
            assert torch.equal(out, served["expected"][tick])  # served, and exactly as plain generate
        stats = session.stats()
    assert stats["requests_served"] == len(requests)
    for tick, (used, limit, budget) in enumerate(zip(footprints, limits, budgets, strict=True)):
        assert budget < limit, tick  # the budget is always below the limit ...
        assert used <= limit, f"tick {tick}: the session used {used} bytes over the kill limit {limit}"
    assert min(budgets) < 0.8 * budgets[0]  # ... and it stepped down as the limit fell
    kinds = [e["kind"] for e in stats["events"]]
    labels = " ".join(e["label"] for e in stats["events"])
    assert "kv-pool" in kinds and "streamed" in labels  # smaller KV pool, weights evicted to disk
    # Without the session: the same requests, counted the same way, reach the limit of the same log.
    over = [t for t, (used, limit) in enumerate(zip(served["plain"], limits, strict=True)) if used > limit]
    assert over, f"plain generate {served['plain']} never reached the limits {limits}"
    assert all(footprints[t] < served["plain"][t] for t in over)


def test_step_down_is_a_function_of_the_ticks() -> None:
    """The same log gives the same budgets, tick by tick; a drop applies at once, a rise waits."""
    lines = (PRESSURE / "android_psi_trim_falling.txt").read_text().splitlines()
    runs = []
    for _ in range(2):
        source = StateBudget.from_lines(lines, start_limit_bytes=1 << 30)
        runs.append([source.advance().to_json() for _ in source.samples])
    assert runs[0] == runs[1]
    budgets = [d["budget_bytes"] for d in runs[0]]
    assert budgets == sorted(budgets, reverse=True)  # a falling log: never up
    psi_trim = runs[0][6]["weights"]
    assert set(psi_trim) == {"psi", "trim"} and psi_trim["trim"] == 0.8  # RUNNING_LOW at tick 6
    rising = StateBudget.from_lines(["MemAvailable: 1000 kB", "MemAvailable: 500 kB"] + ["MemAvailable: 1000 kB"] * 3)
    got = [rising.advance().budget_bytes for _ in rising.samples]
    assert got[1] < got[0] and got[2] == got[1] and got[3] > got[2]  # down at once; up after two calm ticks
    for d in rising.decisions:
        assert d.limit_bytes is not None and 0 <= d.budget_bytes < d.limit_bytes
