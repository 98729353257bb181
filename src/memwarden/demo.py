"""The built-in deployment: a small VLM answering several turns about one image.

Written the way chat loops are commonly written with transformers: every turn
sends the whole conversation and the same image again to ``generate()``. The
run is captured, summarised and written as an HTML report. Later capabilities
(diagnose, GovernedSession) extend it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memwarden.models.chat import DEFAULT_BUDGET_BYTES, DemoConfig, build_deployment, conversation_inputs, run_chat
from memwarden.trace.model import Trace
from memwarden.units import format_bytes

__all__ = [
    "DEFAULT_BUDGET_BYTES",
    "DemoConfig",
    "DemoResult",
    "GovernedResult",
    "LimitedResult",
    "ThermalResult",
    "build_deployment",
    "conversation_inputs",
    "run_chat",
    "run_demo",
    "run_limited",
]


@dataclass
class GovernedResult:
    """The same turns served by a GovernedSession under the budget."""

    trace: Any
    summary: Any
    findings: list[Any]
    outputs_equal: bool
    report_path: Path | None
    trace_path: Path | None
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class ThermalResult:
    """A replayed thermal event against a GovernedSession mid-conversation."""

    log: str
    requests: int
    failed: int
    outputs_equal: bool
    start_budget_bytes: int
    min_budget_bytes: int
    end_budget_bytes: int
    check: Any  # analyze.budget_check.BudgetCheck
    decisions: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LimitedResult:
    """Plain ``generate()`` and a GovernedSession (with the fp32 weights, then with int4 weights) run one
    after the other, each in a child process whose address space is really limited to what it held after
    building the model plus the budget left after the weights: an allocation past it fails in the
    allocator, as on a device."""

    budget_bytes: int
    limit_bytes: int  # the child's RLIMIT_AS
    plain_answered: int  # turns plain generate() answered before failing
    plain_error: str | None  # the allocator's error plain hit (None: it fit)
    governed_answered: int
    governed_error: str | None
    turns: int
    # the session's answers equal plain generate()'s, run without the limit where the limit stopped plain;
    # False where there was nothing to compare
    outputs_equal: bool
    pool_bytes: int = 0  # the session's KV pool, reserved up front
    pool_used_bytes: int = 0  # the most of it one request held
    governed_degraded: int = 0  # turns the session served at a quality rung (visual tokens pruned, a smaller image)
    int4_answered: int = 0  # the session with int4 weights (quantize=4): its outputs are int4's, not fp32's
    int4_error: str | None = None
    int4_ran: bool = False

    @property
    def story(self) -> str:
        from memwarden.units import format_bytes

        limit = f"a real {format_bytes(self.budget_bytes)} limit"
        if self.plain_error is not None and self.governed_error is None:
            same = ", the tokens plain gives without a limit" if self.outputs_equal else ", but NOT plain's tokens"
            if self.governed_degraded:
                same = (
                    f" ({self.governed_degraded} with fewer visual tokens or a smaller image to fit: "
                    f"{'still' if self.outputs_equal else 'not'} the tokens plain gives without a limit)"
                )
            return (
                f"under {limit} plain generate() failed at turn {self.plain_answered + 1} ({self.plain_error}); "
                f"the GovernedSession answered all {self.turns}{same}"
            )
        if self.plain_error is not None and self.int4_ran and self.int4_error is None:
            return (
                f"under {limit} plain generate() failed at turn {self.plain_answered + 1} ({self.plain_error}); "
                f"a GovernedSession with the same fp32 weights {self._fp32()}; with int4 weights "
                f"(quantize=4) it answered all {self.turns}"
            )
        if self.plain_error is None and self.governed_error is None:
            return (
                f"both fit {limit}; the GovernedSession reserves its KV pool up front "
                f"({format_bytes(self.pool_bytes)}, at most {format_bytes(self.pool_used_bytes)} used by one "
                "request), which plain generate() grows only as it goes"
            )
        int4 = f"; with int4 weights {self.int4_error or 'answered'}" if self.int4_ran else ""
        return f"under {limit}: plain {self.plain_error or 'answered'}; GovernedSession {self._fp32()}{int4}"

    def _fp32(self) -> str:
        if self.governed_error is None:
            return f"answered all {self.turns}"
        return f"failed at turn {self.governed_answered + 1} too ({self.governed_error})"


@dataclass
class DemoResult:
    trace: Any
    summary: Any
    report_path: Path | None
    trace_path: Path | None
    config: DemoConfig
    outputs: list[list[int]] = field(default_factory=list)
    findings: list[Any] = field(default_factory=list)
    governed: GovernedResult | None = None
    thermal: ThermalResult | None = None
    limited: LimitedResult | None = None

    @property
    def fits(self) -> bool:
        return bool(self.summary.peak_bytes <= self.config.budget_bytes)


def run_demo(
    config: DemoConfig | None = None,
    out_dir: str | Path = ".",
    progress: Callable[[str, float], None] | None = None,
    real_limit: bool = False,
) -> DemoResult:
    """Build, capture, summarise and report the built-in deployment (``DemoConfig()`` by default).

    ``real_limit``: also serve the turns with plain ``generate()`` and with a GovernedSession in child
    processes under a real address-space limit of the budget (:func:`run_limited`)."""
    config = config or DemoConfig()
    from memwarden.analyze.timeline import summary
    from memwarden.record.live.capture import Capture
    from memwarden.trace.io import save

    def step(text: str, fraction: float) -> None:
        if progress is not None:
            progress(text, fraction)

    out = Path(out_dir)
    step(f"building {config.model} ({config.size}) with random weights", 0.02)
    model, turn_inputs, gen_kwargs = build_deployment(config)
    cap = Capture(
        metadata={
            "model": f"{config.model} ({config.size})",
            "workload": "demo chat",
            "budget_bytes": config.budget_bytes,
        }
    )
    with cap:
        outputs = run_chat(
            model,
            turn_inputs,
            gen_kwargs,
            config,
            on_turn=lambda t: step(f"turn {t + 1}/{config.turns} answered", 0.05 + 0.55 * (t + 1) / config.turns),
        )
    trace = _trace_of(cap)
    step("summarising", 0.62)
    result = summary(trace)
    step("diagnosing", 0.64)
    from memwarden.analyze.diagnose import diagnose
    from memwarden.report.full import write_report

    findings = diagnose(trace, budget_bytes=config.budget_bytes)  # a fix that makes it fit is high
    trace_path = save(trace, out / "demo.mwtrace")
    step("writing report.html", 0.68)
    report_path = out / "report.html"
    title = f"memwarden demo: {config.model} ({config.size}), {config.turns}-turn chat"
    write_report(trace, report_path, title=title, findings=findings)
    governed = None
    if config.governed:
        step("serving the same turns with a GovernedSession", 0.72)
        governed = run_governed(model, turn_inputs, gen_kwargs, config, outputs, out, on_step=step)
    thermal = None
    if config.governed and config.thermal:
        step("replaying a thermal event against the session", 0.8)
        thermal = run_thermal(model, gen_kwargs, config, on_step=step)
    limited = None
    if config.governed and real_limit:
        step("plain generate() and the session under a real memory limit (child processes)", 0.99)
        limited = run_limited(config)
    step("done", 1.0)
    return DemoResult(trace, result, report_path, trace_path, config, outputs, findings, governed, thermal, limited)


ARMS = ("plain", "governed", "governed-int4")


def run_limited(config: DemoConfig, timeout_s: float = 600.0, arms: tuple[str, ...] = ARMS) -> LimitedResult:
    """Run :func:`limited_child` for each arm, each in a fresh child process (a real limit must not
    touch this process, and neither arm may inherit what the other left mapped). The int4 arm runs
    only where plain failed and the fp32 session did not answer (or when ``arms`` names it alone with plain)."""
    import os

    code = "import json, sys; from memwarden.demo import limited_child; print(json.dumps(limited_child(*sys.argv[1:])))"
    # glibc gives each thread a 64 MiB malloc arena of address space, which RLIMIT_AS counts: two arenas, as
    # campaign workers have (resilience/runner.py), so that a thread the session starts costs what it uses.
    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
    empty: dict[str, Any] = {"limit_bytes": 0, "answers": [], "error": None, "pool_bytes": 0, "pool_used_bytes": 0}
    ran: dict[str, dict[str, Any]] = {}
    for arm in arms:
        if (
            arm == "governed-int4"
            and "governed" in ran
            and (ran["plain"]["error"] is None or ran["governed"]["error"] is None)
        ):
            continue  # nothing left to show
        ran[arm] = limited_child_run(code, config, arm, timeout_s, env)
    plain, governed = ran["plain"], ran.get("governed", {**empty, "error": "not run"})
    int4 = ran.get("governed-int4")
    reference = plain["answers"]
    if len(reference) < len(governed["answers"]):  # the limit stopped plain: its answers from a run without one
        reference = limited_child_run(code, config, "reference", timeout_s, env)["answers"]
    both = min(len(reference), len(governed["answers"]))
    return LimitedResult(
        budget_bytes=config.budget_bytes,
        limit_bytes=plain["limit_bytes"],
        turns=config.turns,
        plain_answered=len(plain["answers"]),
        plain_error=plain["error"],
        governed_answered=len(governed["answers"]),
        governed_error=governed["error"],
        outputs_equal=both > 0 and reference[:both] == governed["answers"][:both],
        pool_bytes=governed["pool_bytes"],
        pool_used_bytes=governed["pool_used_bytes"],
        governed_degraded=governed.get("degraded", 0),
        int4_answered=len(int4["answers"]) if int4 else 0,
        int4_error=int4["error"] if int4 else None,
        int4_ran=int4 is not None,
    )


def limited_child_run(code: str, config: DemoConfig, arm: str, timeout_s: float, env: dict[str, str]) -> dict[str, Any]:
    """One arm of :func:`run_limited` in a fresh child process; a child that died is an error, not a crash here."""
    import dataclasses
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(dataclasses.asdict(config)), arm],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=env,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:  # died under the limit (native code aborting on a refused mapping)
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        return {
            "limit_bytes": 0,
            "answers": [],
            "error": f"the process died (exit {proc.returncode}): {tail[0][:160]}",
            "pool_bytes": 0,
            "pool_used_bytes": 0,
        }
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def limited_child(config_json: str, arm: str) -> dict[str, Any]:
    """In a child process: build the deployment, limit the address space to what is mapped now plus the
    budget left after the weights, then serve the turns with plain ``generate()`` (``arm="plain"``) or
    a GovernedSession (``"governed"``; ``"governed-int4"``: with ``quantize=4``, which shrinks the weights
    under the limit); a failure is the allocator's own (or the session's refusal), caught and reported."""
    import gc
    import json
    import os

    import torch

    from memwarden.resilience.inject import apply_address_space_limit, is_oom_error
    from memwarden.runtime.admission import AdmissionError
    from memwarden.runtime.host_memory import first_line, return_freed_memory, state_bytes
    from memwarden.runtime.session import GovernedSession
    from memwarden.runtime.session_config import SessionConfig
    from memwarden.runtime.session_owned import BudgetError

    torch.set_num_threads(1)  # no thread (and stack) created after the limit
    config = DemoConfig(**json.loads(config_json))
    model, turn_inputs, gen_kwargs = build_deployment(config)
    inputs = [turn_inputs(t) for t in range(config.turns)]
    gc.collect()
    return_freed_memory()
    with open("/proc/self/statm") as fh:
        mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = mapped + max(0, config.budget_bytes - state_bytes(model))
    if arm != "reference":  # plain generate() with no limit: the answers the others are compared with
        apply_address_space_limit(limit)
    answers: list[list[int]] = []
    error: str | None = None
    pool_bytes = used_bytes = degraded = 0
    with torch.no_grad():  # as transformers' generate() runs; the session runs its own modes
        try:
            if arm in ("plain", "reference"):
                for request in inputs:
                    out = model.generate(**request, max_new_tokens=config.new_tokens, **gen_kwargs)
                    answers.append(out[0, request["input_ids"].shape[1] :].tolist())
            else:
                bits = 4 if arm == "governed-int4" else None
                session = GovernedSession(model, config.budget_bytes, config=SessionConfig(quantize=bits))
                pool_bytes, page = session.pool.nbytes, session.spec.page_size_bytes
                for request in inputs:
                    out = session.generate(**request, max_new_tokens=config.new_tokens, **gen_kwargs)
                    answers.append(out[0, request["input_ids"].shape[1] :].tolist())
                    used_bytes = max(used_bytes, session.pool.blocks.blocks_needed(out.shape[1]) * page)
                degraded = sum(1 for record in session.records if record.rung > 0)
                try:
                    session.close()
                except BudgetError:
                    pass  # streamed weights that cannot come back under the limit: the process ends here anyway
        except (AdmissionError, BudgetError) as exc:  # the session refused, with its reason
            error = f"refused ({first_line(exc)})"
        except Exception as exc:  # noqa: BLE001 (an allocator failure is the story; anything else is re-raised)
            if not is_oom_error(exc):
                raise
            first = str(exc).splitlines()[0] if str(exc) else ""
            first = re.sub(r"^\[enforce fail at [^\]]*\]\s*(err == 0\.\s*)?", "", first)  # c10's assertion prefix
            error = f"{type(exc).__name__}: {first[:160]}"
    return {
        "limit_bytes": limit,
        "answers": answers,
        "error": error,
        "pool_bytes": pool_bytes,
        "pool_used_bytes": used_bytes,
        "degraded": degraded,
    }


THERMAL_LOG = Path(__file__).resolve().parent / "data" / "thermal_event.jsonl"


def run_thermal(
    model: Any, gen_kwargs: dict[str, Any], config: DemoConfig, on_step: Callable[[str, float], None] | None = None
) -> ThermalResult:
    """A conversation served while a recorded thermal event (an 8 GB board heating past 70 °C,
    scaled to this model's share) halves the session's budget and gives it back: telemetry is
    fed between turns; no request may fail, outputs must stay exact, and the live bytes must
    stay under the budget in force (checked on a capture)."""
    import torch

    from memwarden.analyze.budget_check import check_budget
    from memwarden.govern.scaled import scaled_replay
    from memwarden.govern.telemetry_log import load_log
    from memwarden.record.live.capture import Capture
    from memwarden.runtime.host_memory import state_bytes
    from memwarden.runtime.session import GovernedSession

    turns = replace(config, turns=config.thermal_turns)
    # A share whose halving still holds the weights: 2.4x them, plus room for the safety margin on tiny models.
    samples, controller = scaled_replay(load_log(THERMAL_LOG), int(2.4 * state_bytes(model)) + 2 * 1024**2)
    controller.update(samples[0])
    per_turn = max(1, len(samples) // turns.turns)

    def step(text: str, done: float) -> None:  # the reference answers, then the session's: 0.8 .. 0.99 of the demo
        if on_step is not None:
            on_step(text, 0.8 + 0.19 * done)

    expected = []
    with torch.inference_mode():
        for t in range(turns.turns):
            step(f"thermal event: reference answer {t + 1}/{turns.turns}", t / (2 * turns.turns))
            expected.append(
                model.generate(**conversation_inputs(model, turns, t), max_new_tokens=turns.new_tokens, **gen_kwargs)
            )
    budgets, equal, failed = [controller.budget_bytes], True, 0
    with Capture(metadata={"workload": "demo thermal event"}) as cap, torch.inference_mode():
        session = GovernedSession(model, controller)
        for t in range(turns.turns):
            step(f"thermal event: session turn {t + 1}/{turns.turns}", (turns.turns + t) / (2 * turns.turns))
            for sample in samples[t * per_turn : (t + 1) * per_turn]:
                session.on_telemetry(sample, in_use_bytes=0)  # a recorded log never saw this session
            budgets.append(session.budget_bytes)
            inputs = conversation_inputs(model, turns, t)
            try:
                out = session.generate(**inputs, max_new_tokens=turns.new_tokens, **gen_kwargs)
                equal &= bool(torch.equal(out, expected[t]))
            except Exception:  # noqa: BLE001 (counted and reported: the demo shows whether any request fails)
                failed += 1
            del inputs
        decisions = [e for e in session.events if e["kind"] in ("budget", "kv-pool", "degrade", "stream")]
        session.close()
    return ThermalResult(
        log=THERMAL_LOG.name,
        requests=turns.turns,
        failed=failed,
        outputs_equal=equal,
        start_budget_bytes=budgets[0],
        min_budget_bytes=min(budgets),
        end_budget_bytes=budgets[-1],
        check=check_budget(_trace_of(cap), model_state_bytes=state_bytes(model)),
        decisions=decisions,
    )


def run_governed(
    model: Any,
    turn_inputs: Callable[[int], dict[str, Any]],
    gen_kwargs: dict[str, Any],
    config: DemoConfig,
    naive_outputs: list[list[int]],
    out: Path,
    on_step: Callable[[str, float], None] | None = None,
) -> GovernedResult:
    """Serve the demo's turns through a GovernedSession under ``config.budget_bytes``, captured the
    same way as the naive run (the session, its KV pool included, is created inside the capture)."""
    import torch

    from memwarden.analyze.diagnose import diagnose
    from memwarden.analyze.timeline import summary
    from memwarden.record.live.capture import Capture
    from memwarden.report.full import write_report
    from memwarden.runtime.session import GovernedSession
    from memwarden.trace.io import save

    cap = Capture(
        metadata={
            "model": f"{config.model} ({config.size})",
            "workload": "demo chat, GovernedSession",
            "budget_bytes": config.budget_bytes,
        }
    )
    outputs = []
    with cap, torch.inference_mode():
        session = GovernedSession(model, config.budget_bytes)
        for turn in range(config.turns):
            if on_step is not None:
                on_step(f"GovernedSession: turn {turn + 1}/{config.turns}", 0.72 + 0.06 * turn / config.turns)
            inputs = turn_inputs(turn)
            ids = session.generate(**inputs, max_new_tokens=config.new_tokens, **gen_kwargs)
            outputs.append(ids[0, inputs["input_ids"].shape[1] :].tolist())
        stats = session.stats()
        session.close()
    trace = _trace_of(cap)
    findings = diagnose(trace)
    trace_path = save(trace, out / "governed.mwtrace")
    report_path = out / "governed.html"
    title = f"memwarden demo: {config.model} ({config.size}), {config.turns}-turn chat, GovernedSession"
    write_report(trace, report_path, title=title, findings=findings)
    return GovernedResult(trace, summary(trace), findings, outputs == naive_outputs, report_path, trace_path, stats)


def _trace_of(cap: Any) -> Trace:
    """The trace a finished capture recorded (every capture here ran to its end)."""
    trace = cap.trace
    if trace is None:
        raise RuntimeError("the capture recorded no trace")
    return trace


def verdict(result: DemoResult) -> str:
    budget = result.config.budget_bytes
    peak = result.summary.peak_bytes
    if peak <= budget:
        return f"fits the {format_bytes(budget)} budget with {format_bytes(budget - peak)} to spare"
    return f"exceeds the {format_bytes(budget)} budget by {format_bytes(peak - budget)}"
