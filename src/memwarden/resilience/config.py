"""Campaign configs (TOML): what to serve, how, under which limits.

```toml
name = "plain"                 # label in reports (default: the file name)
[workload]
scenario = "demo-chat"         # built-in (memwarden.models.chat's deployment) ...
model = "llava"                # ... with memwarden.models.chat.DemoConfig fields
size = "small"
turns = 4
# script = "my_app.py"         # ... or a Python script, run in a child per request (path relative to this file)
# args = ["--fast"]
[serving]
mode = "plain"                 # plain | governed | package.module:factory
budget = "320MiB"              # the session's memory budget (governed); squeezes scale it
fit_to_limits = false          # governed: lower the budget to what the watchdog leaves the session's tensors
                               # (limit - what the worker holds beside the model's tensors - jitter chunks)
[serving.options]              # keyword arguments of the mode's factory (GovernedSession(...))
[limits]
address_space = "1.25GiB"      # RLIMIT_AS of each worker (includes ~600 MiB of torch libraries)
rss = "900MiB"                 # optional watchdog: SIGKILL past this resident set (lmkd / jetsam)
# device = "iphone-13"         # ... or the watchdog from a device profile (memwarden.models.devices):
# share = 0.33                 #     share x the profile's usable memory (its per-app kill limit)
count = "resident"             # what the watchdog counts: resident (every resident page) | footprint
                               # (anonymous and shared memory, as iOS's phys_footprint; not clean file pages:
                               # libraries and memory-mapped weights, which the kernel drops under pressure)
gpu_memory = "4GiB"            # optional CUDA cap
request_timeout_s = 120
[run]
workers = 1                    # worker processes per side (each serves whole conversations)
max_restarts = 10              # per worker slot; after that the remaining requests are lost
restart_after_oom = false      # restart a worker whose request hit an in-process OOM
threads = 1                    # torch intra-op threads per worker
inject = []                    # injection specs on top of --inject
```

Parsing is ``tomllib``; every problem is one ``InputError`` naming the file and the key.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from memwarden.errors import InputError
from memwarden.resilience.runner import Limits
from memwarden.units import parse_bytes

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["CampaignConfig", "load_config", "parse_config"]

MAX_CONFIG_BYTES = 1 << 20
_TOP = {"name", "workload", "serving", "limits", "run"}
_SERVING = {"mode", "budget", "options", "fit_to_limits"}
_LIMITS = {"address_space", "rss", "device", "share", "count", "gpu_memory", "request_timeout_s", "start_timeout_s"}
_COUNTS = ("resident", "footprint")
_RUN = {"workers", "max_restarts", "restart_after_oom", "threads", "inject"}
_BUILT_IN_MODES = ("plain", "governed")
_FACTORY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


@dataclass(frozen=True, kw_only=True)
class CampaignConfig:
    name: str
    workload: dict[str, Any]  # scenario + DemoConfig fields, or script (absolute) + args
    mode: str = "plain"
    budget_bytes: int | None = None
    fit_to_limits: bool = False  # governed: the budget is what the RSS watchdog leaves (worker.py)
    options: dict[str, Any] = field(default_factory=dict)
    limits: Limits = Limits()
    workers: int = 1
    max_restarts: int = 10
    restart_after_oom: bool = False
    threads: int = 1
    inject: tuple[str, ...] = ()

    @property
    def turns(self) -> int:
        """Requests per conversation: a worker serves whole conversations."""
        return int(self.workload.get("turns", 4)) if "scenario" in self.workload else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "workload": self.workload,
            "mode": self.mode,
            "budget_bytes": self.budget_bytes,
            "fit_to_limits": self.fit_to_limits,
            "options": self.options,
            "limits": self.limits.to_json(),
            "workers": self.workers,
            "max_restarts": self.max_restarts,
            "restart_after_oom": self.restart_after_oom,
            "threads": self.threads,
            "inject": list(self.inject),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CampaignConfig:
        data = dict(data)
        data["limits"] = Limits(**data["limits"])
        data["inject"] = tuple(data["inject"])
        return cls(**data)


def load_config(path: str | os.PathLike[str]) -> CampaignConfig:
    p = Path(path)
    try:
        if not p.is_file():
            raise InputError(f"{path}: no such config file")
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise InputError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not a campaign config")
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parse_config(data, label=str(path), base_dir=p.parent, default_name=p.stem)


def parse_config(
    data: bytes, *, label: str = "<config>", base_dir: Path = Path("."), default_name: str = "campaign"
) -> CampaignConfig:
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{label}: not UTF-8 text") from None
    except (tomllib.TOMLDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"{label}: not valid TOML ({exc.__class__.__name__}: {str(exc)[:200]})") from None
    r = _Reader(label)
    r.keys("top level", doc, _TOP)
    workload = r.workload(r.table("workload", doc.get("workload")), base_dir)
    serving = r.table("serving", doc.get("serving", {}))
    r.keys("[serving]", serving, _SERVING)
    limits = r.table("limits", doc.get("limits", {}))
    r.keys("[limits]", limits, _LIMITS)
    run = r.table("run", doc.get("run", {}))
    r.keys("[run]", run, _RUN)
    inject = run.get("inject", [])
    if not isinstance(inject, list) or not all(isinstance(s, str) for s in inject):
        r.fail("run.inject", "must be a list of spec strings")
    from memwarden.resilience.inject import parse_inject

    for spec in inject:
        parse_inject(spec)
    return CampaignConfig(
        name=r.string("name", doc.get("name", default_name)),
        workload=workload,
        mode=r.mode(serving.get("mode", "plain")),
        budget_bytes=r.nbytes("serving.budget", serving.get("budget")),
        fit_to_limits=r.fit_to_limits(serving, limits),
        options=r.options(serving.get("mode", "plain"), r.table("serving.options", serving.get("options", {}))),
        limits=Limits(
            address_space_bytes=r.nbytes("limits.address_space", limits.get("address_space")),
            rss_bytes=r.rss(limits),
            rss_counts=r.choice("limits.count", limits.get("count", "resident"), _COUNTS),
            gpu_bytes=r.nbytes("limits.gpu_memory", limits.get("gpu_memory")),
            request_timeout_s=r.number("limits.request_timeout_s", limits.get("request_timeout_s", 120.0)),
            start_timeout_s=r.number("limits.start_timeout_s", limits.get("start_timeout_s", 300.0)),
        ),
        workers=r.integer("run.workers", run.get("workers", 1), 1, 64),
        max_restarts=r.integer("run.max_restarts", run.get("max_restarts", 10), 0, 10_000),
        restart_after_oom=r.boolean("run.restart_after_oom", run.get("restart_after_oom", False)),
        threads=r.integer("run.threads", run.get("threads", 1), 1, 256),
        inject=tuple(inject),
    )


class _Reader:
    def __init__(self, label: str) -> None:
        self.label = label

    def fail(self, where: str, problem: str) -> NoReturn:
        raise InputError(f"{self.label}: {where}: {problem}")

    def keys(self, where: str, table: dict[str, Any], allowed: set[str]) -> None:
        if unknown := set(table) - allowed:
            self.fail(where, f"unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(allowed))}")

    def table(self, where: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(f"[{where}]", "missing or not a table")
        return value

    def string(self, where: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip() or len(value) > 500:
            self.fail(where, f"must be a non-empty string; got {value!r:.80}")
        return value

    def mode(self, value: Any) -> str:
        """``plain``, ``governed``, or ``package.module:factory`` of the user's own code: a standard-library
        callable (``os:system``, ``subprocess:run``, ``builtins:eval``) is no serving mode."""
        mode = self.string("serving.mode", value)
        if mode in _BUILT_IN_MODES:
            return mode
        if not _FACTORY.match(mode):
            self.fail(
                "serving.mode", f"unknown {mode!r:.80}; use {', '.join(_BUILT_IN_MODES)} or package.module:factory"
            )
        top = mode.split(":", 1)[0].split(".", 1)[0]
        if top in sys.stdlib_module_names or top in sys.builtin_module_names:
            self.fail("serving.mode", f"{mode!r:.80} names the standard library, not a serving factory")
        return mode

    def options(self, mode: Any, options: dict[str, Any]) -> dict[str, Any]:
        """The governed mode's options are GovernedSession knobs; plain takes none."""
        if mode == "plain" and options:
            self.fail("serving.options", f"serving mode 'plain' takes no options; got {', '.join(sorted(options))}")
        if mode == "governed":
            import dataclasses

            from memwarden.runtime.session_config import SessionConfig

            knobs = {f.name for f in dataclasses.fields(SessionConfig)}
            self.keys("[serving.options]", options, knobs - {"budget"})
        return options

    def choice(self, where: str, value: Any, choices: tuple[str, ...]) -> str:
        if value not in choices:
            self.fail(where, f"must be one of {', '.join(choices)}; got {value!r:.80}")
        return str(value)

    def rss(self, limits: dict[str, Any]) -> int | None:
        """``rss`` as given, or ``share`` x the usable memory of the device profile ``device`` (its per-app
        kill limit where it has one): a limit that comes from the device, not from where plain peaks."""
        if "device" not in limits:
            if "share" in limits:
                self.fail("limits.share", "is a share of a device profile's memory: give limits.device too")
            return self.nbytes("limits.rss", limits.get("rss"))
        if "rss" in limits:
            self.fail("limits.device", "give limits.rss or limits.device (with limits.share), not both")
        from memwarden.models.devices import builtin_ids, load_profile

        name = self.string("limits.device", limits["device"])
        if name not in builtin_ids():  # a campaign config names a built-in profile, never a path
            self.fail("limits.device", f"unknown device profile {name!r:.80}; built-in: {', '.join(builtin_ids())}")
        share = limits.get("share", 1.0)
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            self.fail("limits.share", f"must be a fraction in (0, 1] of the device's usable memory; got {share!r:.80}")
        return int(load_profile(name).usable_bytes * share)

    def fit_to_limits(self, serving: dict[str, Any], limits: dict[str, Any]) -> bool:
        fit = self.boolean("serving.fit_to_limits", serving.get("fit_to_limits", False))
        if fit and serving.get("mode", "plain") != "governed":
            self.fail("serving.fit_to_limits", "only a governed session has a budget to fit")
        if fit and "rss" not in limits and "device" not in limits:
            self.fail("serving.fit_to_limits", "needs an RSS watchdog to fit under: give limits.rss or limits.device")
        return fit

    def integer(self, where: str, value: Any, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            self.fail(where, f"must be an integer in [{lo}, {hi}]; got {value!r:.80}")
        return value

    def number(self, where: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e6:
            self.fail(where, f"must be a positive number of seconds; got {value!r:.80}")
        return float(value)

    def boolean(self, where: str, value: Any) -> bool:
        if not isinstance(value, bool):
            self.fail(where, f"must be true or false; got {value!r:.80}")
        return value

    def nbytes(self, where: str, value: Any) -> int | None:
        if value is None:
            return None
        try:
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise ValueError("not a byte quantity")
            n = parse_bytes(value)
        except ValueError as exc:
            self.fail(where, f'{exc} (e.g. "1.25GiB")')
        if n <= 0:
            self.fail(where, "must be positive")
        return n

    def workload(self, table: dict[str, Any], base_dir: Path) -> dict[str, Any]:
        if ("scenario" in table) == ("script" in table):
            self.fail("[workload]", "give exactly one of scenario = NAME or script = PATH")
        if "script" in table:
            self.keys("[workload]", table, {"script", "args"})
            script = (base_dir / self.string("workload.script", table["script"])).resolve()
            if not script.is_file():
                self.fail("workload.script", f"{script}: no such script")
            args = table.get("args", [])
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                self.fail("workload.args", "must be a list of strings")
            return {"script": str(script), "args": list(args)}
        from memwarden.models.chat import DemoConfig
        from memwarden.resilience.serving import SCENARIOS

        if table["scenario"] not in SCENARIOS:
            self.fail("workload.scenario", f"unknown {table['scenario']!r:.80}; built-in: {', '.join(SCENARIOS)}")
        fields = DemoConfig.__dataclass_fields__
        self.keys("[workload]", table, {"scenario", *fields} - {"budget_bytes"})
        for key, value in table.items():
            if key == "scenario":
                continue
            if fields[key].type in ("int", int):
                self.integer(f"workload.{key}", value, 0 if key == "seed" else 1, 1 << 20)
            elif fields[key].type in ("bool", bool):
                self.boolean(f"workload.{key}", value)
            else:
                self.string(f"workload.{key}", value)
        if "model" in table or "size" in table:
            from memwarden.models.zoo.archs import NAMES
            from memwarden.models.zoo.base import SIZES

            if table.get("model", "llava") not in NAMES:
                self.fail("workload.model", f"unknown {table['model']!r:.80}; the zoo has {', '.join(NAMES)}")
            if table.get("size", "small") not in SIZES:
                self.fail("workload.size", f"unknown {table['size']!r:.80}; sizes: {', '.join(SIZES)}")
        return dict(table)
