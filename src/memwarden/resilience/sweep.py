"""A campaign that proves a curve: sweep one injection parameter and compare the two sides' failure rates.

One A/B campaign (``campaign.run_campaign``) per point of the sweep, the same requests at every point;
at each point each side's failure rate (requests not answered ``ok``) with a Wilson score interval
(exact enough at 6-200 requests and never outside [0, 1], unlike the normal approximation).

``KIND:KEY=LO..HI:POINTS``, points spaced evenly from LO to HI:

- ``jitter:size=0..256MiB:5`` — another app's chunk; 0 means no jitter at that point. Other jitter keys
  (period, hold) come from an ``--inject jitter:...`` given beside it, else ``period=15ms``;
- ``squeeze:to=100%..40%:4`` — how deep a squeeze goes (at=2s unless an ``--inject squeeze:...`` says);
- ``limits:rss=800MiB..500MiB:4`` — the RSS watchdog (a device's memory killer), on both sides.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from memwarden.errors import InputError
from memwarden.units import format_bytes, parse_bytes

__all__ = ["Sweep", "parse_sweep", "run_sweep", "wilson_interval"]

SWEEP_GRAMMAR = (
    "KIND:KEY=LO..HI:POINTS, e.g. jitter:size=0..256MiB:5, squeeze:to=100%..40%:4, limits:rss=800MiB..500MiB:4"
)
_SWEPT = {("jitter", "size"): "bytes", ("squeeze", "to"): "%", ("limits", "rss"): "bytes"}
_DEFAULTS = {"jitter": "period=15ms", "squeeze": "at=2s"}
_FORM = re.compile(r"^(\w+):(\w+)=([^.]+)\.\.([^:]+):(\d+)$")


@dataclass(frozen=True, kw_only=True)
class Sweep:
    kind: str  # jitter | squeeze | limits
    key: str  # size | to | rss
    values: tuple[float, ...]  # bytes, or a percent of the limit
    unit: str  # "bytes" | "%"

    def label(self, value: float) -> str:
        return f"{value:g}%" if self.unit == "%" else format_bytes(int(value))

    def _text(self, value: float) -> str:
        return f"{value:g}%" if self.unit == "%" else str(int(value))

    def injections(self, value: float, inject: list[str]) -> list[str]:
        """The ``--inject`` specs of one point: ``inject`` with the swept kind's spec set to ``value``."""
        if self.kind == "limits":
            return list(inject)
        same = [s for s in inject if s.split(":", 1)[0].strip() == self.kind]
        rest = [s for s in inject if s not in same]
        if self.kind == "jitter" and value <= 0:
            return rest  # no chunk at all: the point without pressure
        fields = same[0].split(":", 1)[1] if same else _DEFAULTS[self.kind]
        kept = [f for f in fields.split(",") if f and f.split("=", 1)[0].strip() != self.key]
        return rest + [f"{self.kind}:" + ",".join([*kept, f"{self.key}={self._text(value)}"])]

    def configs(self, value: float, config_a: Any, config_b: Any) -> tuple[Any, Any]:
        """Both sides' configs at one point (changed only by a limits sweep)."""
        if self.kind != "limits":
            return config_a, config_b

        def at(config: Any) -> Any:
            return dataclasses.replace(config, limits=dataclasses.replace(config.limits, rss_bytes=int(value)))

        return at(config_a), at(config_b)


def parse_sweep(text: str) -> Sweep:
    match = _FORM.match(str(text).replace(" ", ""))
    if match is None:
        raise InputError(f"bad --sweep {str(text)[:200]!r}; expected {SWEEP_GRAMMAR}")
    kind, key, lo, hi, count = match.groups()
    unit = _SWEPT.get((kind, key))
    if unit is None:
        raise InputError(f"--sweep: {kind}:{key} cannot be swept; one of {', '.join(f'{k}:{v}' for k, v in _SWEPT)}")
    points = int(count)
    if not 2 <= points <= 100:
        raise InputError(f"--sweep: POINTS must be in [2, 100]; got {points}")
    try:
        ends = [float(v.rstrip("%")) if unit == "%" else float(parse_bytes(v)) for v in (lo, hi)]
    except (TypeError, ValueError) as exc:
        raise InputError(f"--sweep {text!r}: {exc}") from None
    if unit == "%" and not all(0 < e <= 100 for e in ends):
        raise InputError("--sweep: a squeeze goes to a percent of the limit in (0, 100]")
    step = (ends[1] - ends[0]) / (points - 1)
    values = tuple(round(ends[0] + i * step, 6) for i in range(points))
    return Sweep(kind=kind, key=key, values=values, unit=unit)


def wilson_interval(failures: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a failure rate (``z`` = 1.96); (0, 1) when there are no requests."""
    if n <= 0:
        return 0.0, 1.0
    p = failures / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _side(summary: dict[str, Any]) -> dict[str, Any]:
    n = int(summary["requests"])
    failed = n - int(summary["ok"])
    low, high = wilson_interval(failed, n)
    return {
        "requests": n,
        "failed": failed,
        "rate": failed / n if n else 0.0,
        "low": low,
        "high": high,
        **{k: summary[k] for k in ("ok", "oom", "crash", "lost", "peak_rss_max_bytes")},
    }


def run_sweep(
    config_a: Any,
    config_b: Any,
    sweep: Sweep,
    *,
    runs: int,
    inject: list[str],
    seed: int = 0,
    executor: Any = None,
    progress: bool = False,
    text: str = "",
    records: bool = False,
) -> dict[str, Any]:
    """One A/B campaign per point (the same requests, the same seed); the two failure-rate curves.
    With ``records`` each point also carries every request's record (``points[i]["records"]``)."""
    from memwarden.resilience.campaign import run_campaign

    points = []
    for value in sweep.values:
        a, b = sweep.configs(value, config_a, config_b)
        specs = sweep.injections(value, inject)
        result = run_campaign(a, b, runs=runs, inject=specs, seed=seed, executor=executor, progress=progress)
        data = result.to_json(records=records)
        points.append(
            {
                "value": value,
                "label": sweep.label(value),
                "inject": specs,
                "rss_limit_bytes": a.limits.rss_bytes,
                "a": _side(data["a"]),
                "b": _side(data["b"]),
                "failure_rate_p_value": data["failure_rate_p_value"],
                **({"records": data["records"]} if records else {}),
            }
        )
    return {
        "sweep": text or f"{sweep.kind}:{sweep.key}",
        "kind": sweep.kind,
        "key": sweep.key,
        "unit": sweep.unit,
        "runs": runs,
        "seed": seed,
        "inject": list(inject),
        "a_name": config_a.name,
        "b_name": config_b.name,
        "points": points,
    }
