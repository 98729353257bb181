"""Where campaign shards and sweep points run: a local process pool (default) or Ray.

One interface, one code path: ``executor.map(fn, specs)`` calls the module-level ``fn`` on
each spec (a JSON-able dict that carries its own seed) and returns the results in the order
of ``specs``. Nothing depends on which process ran a spec or when, so both executors give the
same results for the same seeds (up to wall-clock measurements such as latencies).

Ray is imported only when asked for (``ray`` extra). Without an address a local Ray is
started with ``jobs`` CPUs and no dashboard, and shut down on close; with an address the
executor joins that cluster and leaves it running.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from memwarden.errors import InputError, MemwardenError

__all__ = ["EXECUTORS", "Executor", "LocalExecutor", "RayExecutor", "make_executor"]

EXECUTORS = ("local", "ray")
Task = Callable[[dict[str, Any]], Any]


class Executor:
    """Runs ``fn(spec)`` for each spec; results in spec order. Use as a context manager."""

    name = "base"

    def map(self, fn: Task, specs: Sequence[dict[str, Any]]) -> list[Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check(fn: Task) -> None:
    # Both pools ship the function by reference (module + name); a lambda or closure would
    # work in one and fail in the other, so neither accepts it.
    if getattr(fn, "__qualname__", "").count(".") or fn.__name__ == "<lambda>":
        raise TypeError(f"executor tasks must be module-level functions; got {fn!r}")


class LocalExecutor(Executor):
    """A pool of ``jobs`` fresh processes (spawned, not forked: the parent may hold threads)."""

    name = "local"

    def __init__(self, jobs: int = 1) -> None:
        self.jobs = max(1, int(jobs))
        self._pool: ProcessPoolExecutor | None = None

    def map(self, fn: Task, specs: Sequence[dict[str, Any]]) -> list[Any]:
        _check(fn)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"))
        return list(self._pool.map(fn, specs))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class RayExecutor(Executor):
    """Ray tasks, one CPU each. ``address=None`` starts (and later stops) a local Ray."""

    name = "ray"

    def __init__(self, jobs: int = 1, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise InputError("--executor ray needs Ray: pip install 'memwarden[ray]'") from None
        self._ray = ray
        self._owned = False
        if not ray.is_initialized():
            src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            # Workers import memwarden by module path; an uninstalled checkout needs src on their path.
            runtime_env = {
                "env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
            }
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "runtime_env": runtime_env}
            if address is None:
                kwargs["num_cpus"] = max(1, int(jobs))
            try:
                ray.init(address=address, **kwargs)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise InputError(f"cannot start or join Ray at {address or 'a new local cluster'}: {exc}") from None
            self._owned = True

    def map(self, fn: Task, specs: Sequence[dict[str, Any]]) -> list[Any]:
        _check(fn)
        remote = self._ray.remote(num_cpus=1, max_retries=0)(fn)  # a retried shard would be counted twice
        refs = [remote.remote(spec) for spec in specs]
        try:
            return list(self._ray.get(refs))
        except self._ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            if isinstance(cause, MemwardenError):
                raise InputError(str(cause).splitlines()[-1]) from None
            raise

    def close(self) -> None:
        if self._owned and self._ray.is_initialized():
            self._ray.shutdown()
        self._owned = False


def make_executor(kind: str = "local", *, jobs: int = 1, address: str | None = None) -> Executor:
    if kind == "local":
        if address is not None:
            raise InputError("--ray-address needs --executor ray")
        return LocalExecutor(jobs)
    if kind == "ray":
        return RayExecutor(jobs, address)
    raise InputError(f"unknown executor {kind!r}; choose one of {', '.join(EXECUTORS)}")
