"""A/B resilience campaigns: serve N requests under the same limits and injections, two ways.

``run_campaign(config_a, config_b, runs=N, inject=[...], seed=S, executor=...)`` splits each
side's requests into shards (one per worker slot, whole conversations each), runs every shard
through the executor (``run_shard``: spawn a worker under the limits, send requests one at a
time, restart it when it dies) and compares the sides.

Per request it records ``status`` (ok / oom / crash / lost, see ``runner``), ``latency_s``
(send to answer, or to the failure), ``recovery_s`` (on the first ok request after a run of
failures: from the first failure to this answer, worker restart and model reload included),
``peak_rss_bytes`` (the worker's resident-set peak during the request; the dead worker's
lifetime peak for a request that killed it) and ``output_sha`` (a digest of the answer's token
ids: the same request seeds go to both sides, so a governed session's greedy answers can be
checked against plain ``generate()``).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memwarden.resilience.abtest import bootstrap_ci, bootstrap_diff_ci, fisher_exact, percentile
from memwarden.resilience.config import CampaignConfig
from memwarden.resilience.runner import RunOutcome, ServeWorker, WorkerDied, classify_exit, run_limited

__all__ = ["STATUSES", "CampaignResult", "plan_shards", "request_seed", "run_campaign", "run_shard", "summarize"]

STATUSES = ("ok", "oom", "crash", "lost")
_SEED_STRIDE = 1_000_003  # a prime: conversations of different campaign seeds never share inputs


def request_seed(seed: int, conversation: int) -> int:
    """Input seed of a conversation; equal on both sides so their answers can be compared."""
    return (seed * _SEED_STRIDE + conversation) % (2**31)


def plan_shards(
    config: CampaignConfig, *, side: str, runs: int, seed: int, inject: tuple[str, ...] | list[str] = ()
) -> list[dict[str, Any]]:
    """Task specs (JSON-able) for ``run_shard``: whole conversations dealt to ``config.workers`` slots."""
    turns = config.turns
    conversations = -(-runs // turns)
    shards: list[dict[str, Any]] = []
    for slot in range(min(config.workers, conversations)):
        convs = range(slot, conversations, config.workers)
        indices = [c * turns + t for c in convs for t in range(turns) if c * turns + t < runs]
        shards.append(
            {
                "side": side,
                "slot": slot,
                "config": config.to_json(),
                "inject": [*config.inject, *inject],
                "requests": [{"index": i, "seed": request_seed(seed, i // turns)} for i in indices],
            }
        )
    return shards


def _record(index: int, status: str, **extra: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "index": index,
        "status": status,
        "latency_s": None,
        "recovery_s": None,
        "peak_rss_bytes": None,
        "output_sha": None,
        "error": None,
    }
    rec.update(extra)
    return rec


def _death_error(info: Any) -> str:
    tail = info.stderr_tail.strip().splitlines()[-1:] if info.stderr_tail else []
    how = info.killed_by or (f"signal {info.signal}" if info.signal else f"exit {info.returncode}")
    return f"worker ended ({how})" + (f": {tail[0][:300]}" if tail else "")


_PROGRESS_EVERY = 10  # requests between progress lines


def _progress(spec: dict[str, Any], config: CampaignConfig, records: list[dict[str, Any]]) -> None:
    """One line on stderr every few requests (and at the end) when the campaign asked for progress.

    Written by the shard's own process: stderr is inherited by the local pool and forwarded to
    the driver by Ray, so it reaches the user on both executors."""
    done, total = len(records), len(spec["requests"])
    if not spec.get("progress") or (done % _PROGRESS_EVERY and done != total):
        return
    counts = ", ".join(f"{s} {sum(1 for r in records if r['status'] == s)}" for s in STATUSES)
    slot = f" slot {spec['slot']}" if spec.get("slots", 1) > 1 else ""
    print(
        f"stress: {spec['side'].upper()} ({config.name}){slot}: {done}/{total} requests ({counts})",
        file=sys.stderr,
        flush=True,
    )


def run_shard(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Serve one shard's requests in order; the executor task. Never raises for a failed request."""
    config = CampaignConfig.from_json(spec["config"])
    work_dir = Path(tempfile.mkdtemp(prefix="memwarden-shard-"))
    try:
        if "script" in config.workload:
            return _script_shard(config, spec, work_dir)
        return _serve_shard(config, spec, work_dir)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _script_shard(config: CampaignConfig, spec: dict[str, Any], work_dir: Path) -> list[dict[str, Any]]:
    records, failed_at = [], None
    for req in spec["requests"]:
        env = {"MEMWARDEN_REQUEST_INDEX": str(req["index"]), "MEMWARDEN_REQUEST_SEED": str(req["seed"])}
        begin = time.monotonic()
        outcome: RunOutcome = run_limited(
            config.workload["script"],
            args=config.workload.get("args", []),
            limits=config.limits,
            inject=spec["inject"],
            log_path=work_dir / f"run-{req['index']}.log",
            env=env,
        )
        rec = _record(
            req["index"], outcome.status, latency_s=outcome.wall_s, peak_rss_bytes=outcome.exit.peak_rss_bytes
        )
        if outcome.status != "ok":
            rec["error"] = _death_error(outcome.exit)
            failed_at = failed_at if failed_at is not None else begin + outcome.wall_s
        elif failed_at is not None:
            rec["recovery_s"], failed_at = time.monotonic() - failed_at, None
        records.append(rec)
        _progress(spec, config, records)
    return records


def _serve_shard(config: CampaignConfig, spec: dict[str, Any], work_dir: Path) -> list[dict[str, Any]]:
    job = {
        "workload": config.workload,
        "serving": {"mode": config.mode, "options": config.options},
        "budget_bytes": config.budget_bytes,
        "limit_bytes": config.limits.address_space_bytes,
        "gpu_limit_bytes": config.limits.gpu_bytes,
        "inject": spec["inject"],
        "threads": config.threads,
        "fit_to_limits": config.fit_to_limits,
        "rss_limit_bytes": config.limits.rss_bytes,
        "rss_counts": config.limits.rss_counts,
        "request_timeout_s": config.limits.request_timeout_s,
    }
    records: list[dict[str, Any]] = []
    worker: ServeWorker | None = None
    starts = 0
    failed_at: float | None = None
    try:
        for req in spec["requests"]:
            index = req["index"]
            if worker is None and starts > config.max_restarts:
                records.append(_record(index, "lost", error="worker restarts exhausted"))
                _progress(spec, config, records)
                continue
            begin = time.monotonic()
            try:
                if worker is None:
                    starts += 1
                    worker = ServeWorker(job, config.limits, work_dir / f"worker-{starts}.log", config.threads)
                    worker.start()
                answer = worker.request(index, req["seed"])
            except WorkerDied as died:
                status = classify_exit(died.info)
                status = "crash" if status == "ok" else status  # exited 0 without answering
                records.append(
                    _record(
                        index,
                        status,
                        latency_s=time.monotonic() - begin,
                        peak_rss_bytes=died.info.peak_rss_bytes,
                        error=_death_error(died.info),
                    )
                )
                failed_at = failed_at if failed_at is not None else time.monotonic()
                if worker is not None:
                    worker.close()
                worker = None
                _progress(spec, config, records)
                continue
            rec = _record(
                index,
                answer["status"],
                latency_s=answer.get("latency_s"),
                peak_rss_bytes=answer.get("peak_rss_bytes"),
                output_sha=answer.get("output_sha"),
                error=answer.get("error"),
                injected=answer.get("injected"),
                address_space_bytes=answer.get("address_space_bytes"),
                server_stats=answer.get("server_stats"),
            )
            if rec["status"] == "ok":
                if failed_at is not None:
                    rec["recovery_s"], failed_at = time.monotonic() - failed_at, None
            else:
                failed_at = failed_at if failed_at is not None else time.monotonic()
                if rec["status"] == "oom" and config.restart_after_oom:
                    worker.close()
                    worker = None
            records.append(rec)
            _progress(spec, config, records)
    finally:
        if worker is not None:
            worker.close()
    for rec in records:
        rec["worker_starts"] = starts
    return records


# -- summaries ------------------------------------------------------------------------


def summarize(records: list[dict[str, Any]], *, seed: int = 0, resamples: int = 2000) -> dict[str, Any]:
    """Counts, latency percentiles (ok requests) with a bootstrap CI of the median, recovery, RSS."""
    counts = {s: sum(1 for r in records if r["status"] == s) for s in STATUSES}
    latencies = [r["latency_s"] for r in records if r["status"] == "ok" and r["latency_s"] is not None]
    recoveries = [r["recovery_s"] for r in records if r["recovery_s"] is not None]
    rss = [r["peak_rss_bytes"] for r in records if r["peak_rss_bytes"]]
    ci = bootstrap_ci(latencies, q=50, seed=seed, resamples=resamples)
    return {
        "requests": len(records),
        **counts,
        "failure_rate": (len(records) - counts["ok"]) / len(records) if records else 0.0,
        "p50_latency_s": percentile(latencies, 50),
        "p95_latency_s": percentile(latencies, 95),
        "p50_latency_ci_s": [ci.low, ci.high] if ci else None,
        "recovery_p50_s": percentile(recoveries, 50),
        "recoveries": len(recoveries),
        "peak_rss_p50_bytes": int(percentile(rss, 50) or 0) or None,
        "peak_rss_max_bytes": max(rss) if rss else None,
        "worker_restarts": _restarts(records),
    }


def _restarts(records: list[dict[str, Any]]) -> int:
    by_slot: dict[int, int] = {}
    for r in records:
        if "worker_starts" in r:
            by_slot[r.get("slot", 0)] = r["worker_starts"]
    return sum(max(0, n - 1) for n in by_slot.values())


@dataclass
class CampaignResult:
    config_a: CampaignConfig
    config_b: CampaignConfig
    runs: int
    seed: int
    inject: list[str]
    executor: str
    records_a: list[dict[str, Any]]
    records_b: list[dict[str, Any]]
    a: dict[str, Any] = field(default_factory=dict)
    b: dict[str, Any] = field(default_factory=dict)
    failure_rate_p_value: float = 1.0
    p50_latency_diff_ci_s: list[float] | None = None  # B - A
    outputs_compared: int = 0
    outputs_equal: int = 0
    wall_s: float = 0.0

    def to_json(self, records: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "a": {"name": self.config_a.name, "mode": self.config_a.mode, **self.a},
            "b": {"name": self.config_b.name, "mode": self.config_b.mode, **self.b},
            "failure_rate_p_value": self.failure_rate_p_value,
            "p50_latency_diff_ci_s": self.p50_latency_diff_ci_s,
            "outputs_compared": self.outputs_compared,
            "outputs_equal": self.outputs_equal,
            "runs": self.runs,
            "seed": self.seed,
            "inject": self.inject,
            "executor": self.executor,
            "wall_s": self.wall_s,
        }
        if records:
            out["records"] = {"a": self.records_a, "b": self.records_b}
        return out


def compare(result: CampaignResult, resamples: int = 2000) -> CampaignResult:
    ra, rb = result.records_a, result.records_b
    result.a = summarize(ra, seed=result.seed, resamples=resamples)
    result.b = summarize(rb, seed=result.seed + 1, resamples=resamples)
    result.failure_rate_p_value = fisher_exact(
        result.a["requests"] - result.a["ok"], result.a["ok"], result.b["requests"] - result.b["ok"], result.b["ok"]
    )
    lat = [[r["latency_s"] for r in rs if r["status"] == "ok" and r["latency_s"] is not None] for rs in (ra, rb)]
    ci = bootstrap_diff_ci(lat[0], lat[1], q=50, seed=result.seed + 2, resamples=resamples)
    result.p50_latency_diff_ci_s = [ci.low, ci.high] if ci else None
    sha_b = {r["index"]: r["output_sha"] for r in rb if r["status"] == "ok"}
    pairs = [(r["output_sha"], sha_b[r["index"]]) for r in ra if r["status"] == "ok" and r["index"] in sha_b]
    result.outputs_compared = len(pairs)
    result.outputs_equal = sum(1 for x, y in pairs if x == y)
    return result


def run_campaign(
    config_a: CampaignConfig,
    config_b: CampaignConfig,
    *,
    runs: int,
    inject: list[str] | None = None,
    seed: int = 0,
    executor: Any = None,
    resamples: int = 2000,
    progress: bool = False,
) -> CampaignResult:
    """Run both sides through ``executor`` (default: a one-process local pool) and compare them.

    ``progress``: each shard prints a line on stderr every few requests."""
    from memwarden.errors import InputError
    from memwarden.resilience.executor import LocalExecutor
    from memwarden.resilience.inject import parse_inject

    if isinstance(runs, bool) or not isinstance(runs, int) or not 1 <= runs <= 1_000_000:
        raise InputError(f"runs must be an integer in [1, 1000000]; got {runs!r}")
    inject = list(inject or [])
    for spec in inject:
        parse_inject(spec)
    shards = plan_shards(config_a, side="a", runs=runs, seed=seed, inject=inject)
    shards += plan_shards(config_b, side="b", runs=runs, seed=seed, inject=inject)
    for shard in shards:  # not part of the task's identity: results are the same either way
        shard["progress"] = progress
        shard["slots"] = sum(1 for other in shards if other["side"] == shard["side"])
    own = executor is None
    executor = executor or LocalExecutor(1)
    begin = time.monotonic()
    try:
        results = executor.map(run_shard, shards)
    finally:
        if own:
            executor.close()
    by_side: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for shard, records in zip(shards, results, strict=True):
        by_side[shard["side"]] += [{**r, "slot": shard["slot"]} for r in records]
    result = CampaignResult(
        config_a=config_a,
        config_b=config_b,
        runs=runs,
        seed=seed,
        inject=inject,
        executor=executor.name,
        records_a=sorted(by_side["a"], key=lambda r: r["index"]),
        records_b=sorted(by_side["b"], key=lambda r: r["index"]),
        wall_s=time.monotonic() - begin,
    )
    return compare(result, resamples)
