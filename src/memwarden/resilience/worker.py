"""The child side of a campaign: this file run as ``__main__`` (``runner`` runs it by path, so that a
script workload without injections imports nothing of memwarden: its top level is the standard library).

The job comes as JSON in ``MEMWARDEN_WORKER_JOB``. The address-space limit is set before
anything heavy is imported (torch maps ~600 MiB of libraries, and they must fit under the
limit like on a device), then the injections start, then either

- ``kind = "script"``: the user's script runs here as ``__main__`` (it is never imported
  into the campaign process) and the exit status says what happened, or
- ``kind = "serve"``: a scenario and a serving mode are built once and requests are read as
  JSON lines from stdin; each answer is one JSON line on the fd named in the job.

Exit statuses: 0 done, ``EXIT_OOM`` when a memory failure escaped, ``EXIT_CRASH`` for any
other uncaught exception. The parent reads signals (SIGKILL = the OOM killer or the RSS
watchdog) from the wait status.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import sys
import time
import traceback
from typing import Any

EXIT_OOM = 86
EXIT_CRASH = 87
JOB_ENV = "MEMWARDEN_WORKER_JOB"
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# fit_to_limits: what the worker keeps free of the budget beside what it measured (the session's
# bookkeeping and allocator rounding, beyond its tensor prediction: ~8 MiB measured on the demo deployment).
_FIT_MARGIN_BYTES = 16 * 1024**2


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak_rss() -> None:
    """Linux resets VmHWM when "5" is written to clear_refs, so each request gets its own peak."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def resident_bytes(pid: int | str = "self", counts: str = "resident") -> int:
    """The resident set of ``pid`` or, with ``counts="footprint"``, its anonymous and shared-memory pages
    (RssAnon + RssShmem): what iOS's phys_footprint counts of them, leaving out clean file pages
    (libraries, memory-mapped weights) that the kernel drops under pressure. The jitter's chunk is
    shared anonymous memory (``mmap.mmap(-1, n)``): shmem, counted."""
    try:
        if counts != "footprint":
            with open(f"/proc/{pid}/statm") as fh:
                return int(fh.read().split()[1]) * _PAGE_BYTES
        total = 0
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("RssAnon:", "RssShmem:")):
                    total += int(line.split()[1]) * 1024
        return total
    except (OSError, IndexError, ValueError):
        return 0


def peak_rss_bytes() -> int:
    try:
        return _status_kib("VmHWM") * 1024
    except OSError:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class _Injected:
    """The running injections of this process and the hooks squeezes and telemetry call."""

    def __init__(self, job: dict[str, Any]) -> None:
        from memwarden.resilience.inject import Jitter, Schedule, Squeeze, Telemetry, parse_inject

        specs = [parse_inject(s) for s in job.get("inject", [])]
        self.limit_bytes: int | None = job.get("limit_bytes")
        self.budget_bytes: int | None = job.get("budget_bytes")
        self.gpu_limit_bytes: int | None = job.get("gpu_limit_bytes")
        self.server: Any = None
        self.telemetry_samples = 0
        self.jitter_specs = [s for s in specs if isinstance(s, Jitter)]
        self.jitters: list[Any] = []
        # Squeezes are relative to the first of: the host limit, the GPU limit, the budget.
        base = next((b for b in (self.limit_bytes, self.gpu_limit_bytes, self.budget_bytes) if b is not None), None)
        self.schedule = Schedule(
            squeezes=[s for s in specs if isinstance(s, Squeeze)],
            telemetry=[s for s in specs if isinstance(s, Telemetry)],
            base_limit_bytes=base,
            on_limit=self._on_limit,
            on_telemetry=self._on_telemetry,
        )
        self._base = base
        self.fraction = 1.0  # of the budget a squeeze leaves now

    def start(self) -> None:
        """Jitter and the schedule's clock start here: when the script starts, or when serving starts
        (after the model is loaded, so that squeeze times are times into serving). The other app is
        resident before the first request: each jitter's first chunk is touched (or refused) first."""
        self.jitters = [s.start() for s in self.jitter_specs]
        for jitter in self.jitters:
            jitter.first_pass.wait(timeout=120)
        self.schedule.start()

    def _on_limit(self, new_bytes: int) -> None:
        from memwarden.resilience.inject import apply_address_space_limit

        fraction = new_bytes / self._base if self._base else 1.0
        self.fraction = fraction
        if self.limit_bytes is not None:
            apply_address_space_limit(int(self.limit_bytes * fraction))
        if self.gpu_limit_bytes is not None:
            _cuda_limit(int(self.gpu_limit_bytes * fraction))
        if self.budget_bytes is not None and self.server is not None and hasattr(self.server, "set_budget"):
            self.server.set_budget(int(self.budget_bytes * fraction))

    def _on_telemetry(self, sample: Any) -> None:
        self.telemetry_samples += 1
        if self.server is not None and hasattr(self.server, "on_telemetry"):
            self.server.on_telemetry(sample)

    def record(self) -> dict[str, Any]:
        return {
            "jitter_cycles": sum(j.stats.cycles for j in self.jitters),
            "jitter_failed": sum(j.stats.failed for j in self.jitters),
            "jitter_touched_bytes": sum(j.stats.touched_bytes for j in self.jitters),
            "jitter_error": next((j.stats.last_error for j in self.jitters if j.stats.last_error), None),
            "telemetry_samples": self.telemetry_samples,
            "schedule": list(self.schedule.events),
        }


def _cuda_limit(limit_bytes: int) -> None:
    """On CUDA the same limit caps the caching allocator (a fraction of the device's memory)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit_bytes / total))


def _run_script(job: dict[str, Any]) -> int:
    import runpy

    sys.argv = [job["script"], *job.get("args", [])]
    sys.path.insert(0, os.path.dirname(os.path.abspath(job["script"])))
    runpy.run_path(job["script"], run_name="__main__")
    return 0


def _serve(job: dict[str, Any], injected: _Injected, out: Any) -> int:
    from memwarden.resilience.inject import is_oom_error
    from memwarden.resilience.serving import load_scenario, make_server

    begin = time.monotonic()
    import torch

    torch.set_num_threads(int(job.get("threads", 1)))
    if job.get("gpu_limit_bytes") and torch.cuda.is_available():
        _cuda_limit(int(job["gpu_limit_bytes"]))
    scenario = load_scenario(job["workload"])
    serving = job.get("serving", {})
    fit: dict[str, Any] | None = None
    if job.get("fit_to_limits") and job.get("rss_limit_bytes"):
        fit = fit_budget(scenario.model, injected, int(job["rss_limit_bytes"]), job.get("rss_counts", "resident"))
        injected.budget_bytes = fit["budget_bytes"]  # squeezes scale the fitted budget
    server = make_server(
        serving.get("mode", "plain"),
        scenario.model,
        budget_bytes=injected.budget_bytes,
        options=serving.get("options", {}),
        gen_kwargs=scenario.gen_kwargs,
    )
    injected.server = server
    injected.start()
    _send(out, {"ready": True, "load_s": time.monotonic() - begin, "fit": fit})
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("stop"):
            break
        if fit is not None:
            fit = refit_budget(fit, server, injected)
        reset_peak_rss()
        if job.get("request_timeout_s"):  # a request that hangs leaves every thread's stack in the log
            faulthandler.dump_traceback_later(max(1.0, float(job["request_timeout_s"]) - 2.0))
        t0 = time.perf_counter()
        answer: dict[str, Any] = {"index": req["index"]}
        try:
            tokens = server.generate(scenario.inputs(req["index"], req["seed"]), scenario.max_new_tokens)
            answer.update(status="ok", output_sha=hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16])
        except Exception as exc:  # a failed request is data for the campaign; the worker keeps serving
            answer.update(status="oom" if is_oom_error(exc) else "crash", error=f"{type(exc).__name__}: {exc}"[:500])
            import gc

            gc.collect()
        answer["latency_s"] = time.perf_counter() - t0
        faulthandler.cancel_dump_traceback_later()
        answer["peak_rss_bytes"] = peak_rss_bytes()
        answer["address_space_bytes"] = _status_kib("VmSize") * 1024  # what RLIMIT_AS compares against
        answer["injected"] = injected.record()
        if fit is not None:
            answer["injected"]["fit"] = fit
        if hasattr(server, "stats"):
            try:
                answer["server_stats"] = server.stats()
            except Exception as exc:
                answer["server_stats"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        _send(out, answer)
    return 0


def _state_bytes(model: Any) -> int:
    """Bytes of the model's parameters and buffers, each storage once (tied weights share one)."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        storage = t.untyped_storage()
        if t.device.type == "cpu":
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def fit_budget(model: Any, injected: _Injected, limit_bytes: int, counts: str = "resident") -> dict[str, Any]:
    """The budget a governed session can have under an RSS watchdog of ``limit_bytes``.

    The watchdog counts the whole process: the interpreter, torch's and transformers' code and data,
    and another app's pages (the jitter's chunk, which runs in this process) — not only the tensors a
    session's budget is about. So the worker plays the device's memory report (iOS's
    ``os_proc_available_memory``, Android's ``ActivityManager.MemoryInfo``): it measures what the
    process holds beside the model's tensors once the model is built, and takes another app's pages
    at their largest (the jitter specs' sizes: measuring them by exposure would mean being killed for
    them first). The session gets the rest, less a margin, capped at the configured budget; it
    streams the weights that do not fit (``stream = "auto"``)."""
    import gc

    gc.collect()
    other = max(0, resident_bytes("self", counts) - _state_bytes(model))
    pressure = sum(spec.size_bytes for spec in injected.jitter_specs)
    budget = limit_bytes - other - pressure - _FIT_MARGIN_BYTES
    if injected.budget_bytes is not None:
        budget = min(budget, injected.budget_bytes)
    return {
        "budget_bytes": max(1, budget),
        "limit_bytes": limit_bytes,
        "counts": counts,
        "other_bytes": other,
        "pressure_bytes": pressure,
        "margin_bytes": _FIT_MARGIN_BYTES,
        "configured_bytes": injected.budget_bytes,
        "shmem_bytes": _status_kib("RssShmem") * 1024,
        "other_at_fit_bytes": other,
        "refits": 0,
    }


def refit_budget(fit: dict[str, Any], server: Any, injected: _Injected) -> dict[str, Any]:
    """The fitted budget again, before a request, from what the process holds beside the session now.

    What runs beside the tensors grows as the process serves (kernel caches and the interpreter's own
    data on the first requests, a few MiB per conversation after): measured on the demo chat, ~37 MiB
    over 12 requests, ~10 MiB with the session returning freed heap pages. A budget fitted once at start
    lets that growth reach the watchdog. So, as a device's memory report would, the worker measures it
    again each request: the count less what the session holds, less the jitter's pages (shared memory,
    ``RssShmem``, above what the process had before the jitter started) — another app's pages are
    already taken at their largest. A squeeze in force scales the new budget like the old."""
    session = getattr(server, "session", None)
    memory = getattr(session, "memory", None)
    if session is None or memory is None or not hasattr(session, "set_budget"):
        return fit
    from memwarden.runtime.host_memory import wait_for_trims

    wait_for_trims()  # the last request's freed heap pages, handed back off its path, are gone first
    jitter_now = max(0, _status_kib("RssShmem") * 1024 - int(fit["shmem_bytes"]))
    # Never below the first measurement: what the session holds counts pages it has not touched yet (a
    # KV pool's), which would read as the process shrinking and let the budget rise by them.
    other = resident_bytes("self", str(fit["counts"])) - jitter_now - int(memory.held_bytes)
    other = max(other, int(fit["other_at_fit_bytes"]))
    budget = int(fit["limit_bytes"]) - other - int(fit["pressure_bytes"]) - _FIT_MARGIN_BYTES
    if fit.get("configured_bytes") is not None:
        budget = min(budget, int(fit["configured_bytes"]))
    budget = max(1, budget)
    if abs(budget - int(fit["budget_bytes"])) < 1024**2:
        return fit
    injected.budget_bytes = budget  # squeezes scale the new fitted budget
    session.set_budget(int(budget * injected.fraction), temporary=injected.fraction < 1.0)
    return {**fit, "budget_bytes": budget, "other_bytes": other, "refits": int(fit["refits"]) + 1}


def _send(out: Any, message: dict[str, Any]) -> None:
    out.write(json.dumps(message, default=str) + "\n")
    out.flush()


def main() -> int:
    job = json.loads(os.environ[JOB_ENV])
    if job.get("limit_bytes") is not None:
        # First thing, before torch: the limit covers loading, as on the device.
        import resource

        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (int(job["limit_bytes"]), hard))
    try:
        if job["kind"] == "script":
            if job.get("inject"):  # the injections are memwarden's code: a script without any imports none of it
                _Injected(job).start()
            return _run_script(job)
        injected = _Injected(job)
        out = os.fdopen(int(job["result_fd"]), "w", buffering=1)
        return _serve(job, injected, out)
    except SystemExit as exc:  # a script's own exit status is its verdict
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException as exc:
        traceback.print_exc()
        exc.__traceback__ = None  # frees the failed frames (what a hog had allocated) before classifying
        return EXIT_OOM if _is_oom(exc) else EXIT_CRASH


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):  # no import needed to tell
        return True
    try:
        from memwarden.resilience.inject import is_oom_error
    except BaseException:  # the limit refused even memwarden's own import
        return isinstance(exc, MemoryError)
    return is_oom_error(exc)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: a wedged daemon thread or torch pool cannot hang the exit
