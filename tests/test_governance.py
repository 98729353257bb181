"""A GovernedSession following a moving budget: a replayed thermal event halves it mid-conversation,
the KV pool shrinks through the swap tier and grows back, no request fails, outputs stay exact,
and the live bytes a capture measures stay under the budget in force."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from memwarden.analyze.budget_check import check_budget
from memwarden.govern.scaled import scaled_replay
from memwarden.govern.telemetry_log import load_log
from memwarden.models import zoo
from memwarden.models.chat import DemoConfig, conversation_inputs
from memwarden.record.live.capture import Capture
from memwarden.runtime.host_memory import state_bytes
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.session_config import SessionConfig

THERMAL = Path(__file__).parent.parent / "examples" / "telemetry" / "thermal_event.jsonl"


@pytest.mark.parametrize("name", ["llava", "qwen2-audio"])
def test_thermal_event_halves_the_budget_and_nothing_fails(name):
    model = zoo.build_model(name, "tiny")
    gk = zoo.generate_kwargs(name)
    samples, controller = scaled_replay(load_log(THERMAL), 6 * state_bytes(model))
    controller.update(samples[0])
    config = DemoConfig(model=name, size="tiny", turns=8)
    per_turn = len(samples) // config.turns
    budgets = []
    with torch.inference_mode():  # plain transformers' answers, computed outside the measurement
        expected = [
            model.generate(**conversation_inputs(model, config, turn), max_new_tokens=config.new_tokens, **gk)
            for turn in range(config.turns)
        ]
    with Capture() as cap, torch.inference_mode():
        session = GovernedSession(model, budget=controller)
        for turn in range(config.turns):
            for sample in samples[turn * per_turn : (turn + 1) * per_turn]:
                session.on_telemetry(sample, in_use_bytes=0)  # a recorded log: it never saw this session
            inputs = conversation_inputs(model, config, turn)  # the request's tensors count: made in the capture
            out = session.generate(**inputs, max_new_tokens=config.new_tokens, **gk)
            del inputs
            budgets.append(session.budget_bytes)
            assert torch.equal(out, expected[turn])
    assert len(session.records) == config.turns  # no request failed or was lost
    assert min(budgets) <= 0.55 * budgets[0] and budgets[-1] >= 0.9 * budgets[0]  # halved, then recovered
    kinds = [e["kind"] for e in session.events]
    assert "kv-pool" in kinds and "budget" in kinds
    sizes = [e["blocks"] for e in session.events if e["kind"] == "kv-pool"]
    assert min(sizes) < sizes[0] and sizes[-1] > min(sizes)  # shrank and grew back
    assert sum(r.reused_tokens for r in session.records[1:]) > 0  # cached prefixes survived the resizes
    check = check_budget(cap.trace, model_state_bytes=state_bytes(model))
    assert check.checked_events > 1000 and check.min_budget_bytes <= 0.55 * check.max_budget_bytes
    if not check.ok:
        from memwarden.analyze.timeline import top_sites_at

        i = int(np.searchsorted(cap.trace.events["time_us"], check.worst_time_us))
        pytest.fail(
            f"{check.worst_over_bytes} bytes over the budget in force at {check.worst_time_us} us: "
            f"{top_sites_at(cap.trace, i, 0, 4)}"
        )


def test_squeeze_shrinks_the_pool_and_keeps_recent_prefixes():
    model = zoo.build_model("llava", "tiny")
    gk = zoo.generate_kwargs("llava")
    weights = state_bytes(model)
    session = GovernedSession(model, budget=weights * 4)
    config = DemoConfig(size="tiny", turns=3)
    with torch.inference_mode():
        session.generate(**conversation_inputs(model, config, 0), max_new_tokens=config.new_tokens, **gk)
        blocks_before = session.pool.num_blocks
        session.set_budget(int(weights * 1.5))
        assert session.pool.num_blocks < blocks_before
        assert session.held_bytes <= weights * 1.5
        inputs = conversation_inputs(model, config, 1)
        out = session.generate(**inputs, max_new_tokens=config.new_tokens, **gk)
    assert torch.equal(out, model.generate(**inputs, max_new_tokens=config.new_tokens, **gk))
    assert session.records[-1].reused_tokens > 0
    session.pool.blocks.check()


def test_latency_ladder_prunes_visual_tokens_and_recovers():
    from memwarden.runtime.degrade import LadderConfig

    model = zoo.build_model("llava", "tiny")
    gk = zoo.generate_kwargs("llava")
    config = LadderConfig(latency_target_s=1e-6, recover_after=1)  # every request is "too slow"
    session = GovernedSession(model, budget="64MiB", config=SessionConfig(ladder=config, prefix_reuse=False))
    inputs = zoo.make_inputs(model, prompt_tokens=24)
    image_tokens = int((inputs["input_ids"] == model.config.image_token_index).sum())
    with torch.inference_mode():
        full = session.generate(**inputs, max_new_tokens=4, **gk)
        assert session.ladder.latency.level == 1  # over the target: the next request is degraded
        pruned = session.generate(**inputs, max_new_tokens=4, **gk)
        session.ladder.latency.config = LadderConfig(latency_target_s=1e6, recover_after=1)  # now every request is calm
        again = session.generate(**inputs, max_new_tokens=4, **gk)
    recs = session.records
    assert [r.rung for r in recs] == [0, 1, 2]  # level rose after each slow request...
    assert recs[1].prompt_tokens == inputs["input_ids"].shape[1] - image_tokens // 2  # 50% of the image pruned
    assert recs[2].prompt_tokens == inputs["input_ids"].shape[1] - image_tokens + image_tokens // 4
    assert session.ladder.latency.level == 1  # ...and a calm request stepped it back down
    # Pruned or not, the output is the caller's prompt and the new tokens, as generate() returns them:
    # `out[:, input_ids.shape[1]:]` is the answer either way.
    prompt = inputs["input_ids"]
    for out in (full, pruned, again):
        assert out.shape[1] == prompt.shape[1] + 4 and torch.equal(out[:, : prompt.shape[1]], prompt)
    kinds = [e["label"] for e in session.events if e["kind"] == "degrade"]
    assert any("latency level" in k for k in kinds)


def test_telemetry_from_another_thread_never_resizes_under_a_request() -> None:
    """Telemetry from another thread swings the temperature (so the budget, so the KV pool size)
    between requests and in the middle of each: a resize happens only between requests (every resize
    holds the session's lock), no request sees its pool change, and greedy outputs are those of
    model.generate(). The other thread runs at fixed points (started and joined from the serving
    thread: between requests, and from inside generation at the first token), so the test does not
    depend on how threads happen to interleave."""
    import threading

    from memwarden.govern.telemetry import TelemetrySample

    model = zoo.build_model("llava", "tiny")
    gen = zoo.generate_kwargs("llava")
    inputs = [zoo.make_inputs(model, prompt_tokens=20 + 4 * i, seed=i) for i in range(6)]
    with torch.inference_mode():
        expected = [model.generate(**x, max_new_tokens=4, **gen)[0, x["input_ids"].shape[1] :] for x in inputs]
    weights = state_bytes(model)
    session = GovernedSession(model, budget=weights + 16 * 2**20)
    errors: list[BaseException] = []
    clock = [0.0]

    def telemetry_thread(hot: bool) -> None:
        """Three samples from another thread, waited for: the smoothed temperature moves each time."""

        def send() -> None:
            for _ in range(3):
                clock[0] += 6.0  # past the hysteresis: every sample may move the budget
                try:
                    session.on_telemetry(TelemetrySample(t_s=clock[0], temp_c=95.0 if hot else 40.0), in_use_bytes=0)
                except Exception as exc:  # noqa: BLE001 - the test reports it
                    errors.append(exc)

        thread = threading.Thread(target=send)
        thread.start()
        thread.join()

    class MidRequest:  # a generate() streamer: the first token arrives while the request holds the pool
        def __init__(self, hot: bool) -> None:
            self.hot, self.calls, self.pools = hot, 0, []

        def put(self, value: torch.Tensor) -> None:
            self.calls += 1
            if self.calls == 2:
                before = session.pool
                telemetry_thread(self.hot)
                self.pools.append((before, session.pool, before.num_blocks, session.pool.num_blocks))

        def end(self) -> None:
            pass

    got, budgets = [], []
    for i, x in enumerate(inputs):
        telemetry_thread(hot=i % 2 == 1)  # between requests: the pool follows
        budgets.append(session.budget_bytes)
        mid = MidRequest(hot=i % 2 == 0)  # the opposite swing, under the request: the pool must not move
        got.append(session.generate(**x, max_new_tokens=4, streamer=mid, **gen)[0, x["input_ids"].shape[1] :])
        ((before, after, blocks_before, blocks_after),) = mid.pools
        assert after is before and blocks_after == blocks_before
    assert not errors
    assert len(set(budgets)) > 1  # the budget did swing
    labels = [e["label"] for e in session.events]
    assert sum("resize" in lb or "pool" in lb for lb in labels) > 2, labels  # the pool did swing, between requests
    for want, have in zip(expected, got, strict=True):
        assert torch.equal(want, have)
