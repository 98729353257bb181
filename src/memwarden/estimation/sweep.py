"""Estimate sweeps: models x requests (x devices) through an executor.

A grid file (TOML)::

    models = ["llava", "qwen2-vl:small"]          # any MODEL ``memwarden estimate`` takes
    devices = ["raspberry-pi-5-8gb", "iphone-15-pro"]   # profile ids or TOML paths (optional)
    [[requests]]
    name = "short chat"                            # optional label
    prompt_tokens = 64                             # and any of: image = "WxH", audio_seconds,
    new_tokens = 8                                 # batch, dtype, weights_dtype, kv_dtype

Each (model, request) point is one executor task calling ``memwarden.estimate(...)`` (the
meta-device estimate; devices do not change the peak, so they are applied afterwards in the
parent). Estimates are deterministic, so both executors give identical tables.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from memwarden.errors import InputError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["Grid", "estimate_point", "load_grid", "run_sweep"]

MAX_GRID_BYTES = 1 << 20
MAX_POINTS = 10_000
_REQUEST_KEYS = {
    "name",
    "image",
    "audio_seconds",
    "prompt_tokens",
    "new_tokens",
    "batch",
    "dtype",
    "weights_dtype",
    "kv_dtype",
}


@dataclass(frozen=True, kw_only=True)
class Grid:
    models: tuple[str, ...]
    devices: tuple[Any, ...]  # DeviceProfile
    requests: tuple[dict[str, Any], ...]  # estimate() keyword arguments plus "name"


def _fail(label: str, where: str, problem: str) -> NoReturn:
    raise InputError(f"{label}: {where}: {problem}")


def load_grid(path: str | os.PathLike[str]) -> Grid:
    from memwarden.models.devices import load_profile

    label, p = str(path), Path(path)
    try:
        if not p.is_file():
            raise InputError(f"{label}: no such grid file")
        if p.stat().st_size > MAX_GRID_BYTES:
            raise InputError(f"{label}: larger than {MAX_GRID_BYTES} bytes; not a sweep grid")
        doc = tomllib.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{label}: not UTF-8 text") from None
    except (tomllib.TOMLDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"{label}: not valid TOML ({exc.__class__.__name__}: {str(exc)[:200]})") from None
    except OSError as exc:
        raise InputError(f"{label}: cannot read ({exc.strerror or exc})") from None
    if unknown := set(doc) - {"models", "devices", "requests"}:
        _fail(label, "top level", f"unknown key(s) {', '.join(sorted(unknown))}; known: models, devices, requests")
    models = doc.get("models")
    if not isinstance(models, list) or not models or not all(isinstance(m, str) and m.strip() for m in models):
        _fail(label, "models", "must be a non-empty list of model names")
    devices = doc.get("devices", [])
    if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        _fail(label, "devices", "must be a list of device profile ids or paths")
    raw_requests = doc.get("requests", [{}])
    if not isinstance(raw_requests, list) or not raw_requests or not all(isinstance(r, dict) for r in raw_requests):
        _fail(label, "requests", "must be one or more [[requests]] tables")
    requests = []
    for i, raw in enumerate(raw_requests):
        where = f"requests[{i}]"
        if unknown := set(raw) - _REQUEST_KEYS:
            _fail(
                label, where, f"unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_REQUEST_KEYS))}"
            )
        for key in ("audio_seconds", "prompt_tokens", "new_tokens", "batch"):
            if isinstance(raw.get(key), float) and not math.isfinite(raw[key]):  # TOML has inf and nan
                _fail(label, f"{where}.{key}", f"must be a finite number; got {raw[key]}")
        req = {k: v for k, v in raw.items() if k not in ("name", "image")}
        if "image" in raw:
            if not isinstance(raw["image"], str):
                _fail(label, f"{where}.image", "must be a string WIDTHxHEIGHT")
            req["images"] = [_parse_image(label, f"{where}.image", raw["image"])]
        name = raw.get("name", _describe(raw))
        if not isinstance(name, str):
            _fail(label, f"{where}.name", "must be a string")
        requests.append({"name": name, **req})
    if len(models) * len(requests) > MAX_POINTS:
        _fail(label, "grid", f"{len(models) * len(requests)} points; at most {MAX_POINTS}")
    profiles = tuple(load_profile(d) for d in devices)
    return Grid(models=tuple(models), devices=profiles, requests=tuple(requests))


def _parse_image(label: str, where: str, text: str) -> list[int]:
    # estimate.parse_image's rule, without importing torch into the parent
    w, sep, h = text.lower().partition("x")
    if not (sep and w.isdigit() and h.isdigit() and int(w) > 0 and int(h) > 0 and len(text) < 20):
        _fail(label, where, f"takes WIDTHxHEIGHT in pixels, e.g. 448x336; got {text!r:.40}")
    return [int(w), int(h)]


def _describe(raw: dict[str, Any]) -> str:
    parts = [
        f"{raw['image']}" if "image" in raw else "",
        f"{raw['audio_seconds']}s audio" if "audio_seconds" in raw else "",
        f"{raw.get('prompt_tokens', 128)} prompt",
        f"{raw.get('new_tokens', 16)} new",
    ]
    return ", ".join(p for p in parts if p)


def estimate_point(spec: dict[str, Any]) -> dict[str, Any]:
    """Executor task: one model x request; errors a user caused come back as data, not exceptions."""
    from memwarden.errors import MemwardenError
    from memwarden.estimation.run import estimate

    kwargs = {k: v for k, v in spec["request"].items() if k != "name"}
    if "images" in kwargs:
        kwargs["images"] = [tuple(wh) for wh in kwargs["images"]]
    out: dict[str, Any] = {"model": spec["model"], "request": spec["request"]["name"]}
    try:
        card = estimate(spec["model"], suggest=False, **kwargs)
    except MemwardenError as exc:
        return {**out, "error": str(exc)}
    except TypeError as exc:  # a request key estimate() does not take, or a value of the wrong type
        return {**out, "error": f"bad request: {exc}"}
    except Exception as exc:  # noqa: BLE001 - one point's failure is that point's row, never a traceback
        what = " ".join(str(exc).split())[:200]
        return {**out, "error": f"this point failed ({type(exc).__name__}: {what})"}
    return {
        **out,
        "peak_bytes": card.peak_bytes,
        "weights_bytes": card.weights_bytes,
        "kv_cache_bytes": card.kv_cache_bytes,
        "phases": {name: info["peak_bytes"] for name, info in card.phases.items()},
    }


def run_sweep(grid: Grid, executor: Any) -> list[dict[str, Any]]:
    """One row per (model, request), in grid order, with a verdict per device; InputError on a bad point."""
    specs = [{"model": m, "request": r} for m in grid.models for r in grid.requests]
    rows = executor.map(estimate_point, specs)
    for row in rows:
        if "error" in row:
            raise InputError(f"model {row['model']!r}, request {row['request']!r}: {row['error']}")
        row["devices"] = {
            d.id: {
                "usable_bytes": d.usable_bytes,
                "fits": row["peak_bytes"] <= d.usable_bytes,
                "headroom_bytes": d.usable_bytes - row["peak_bytes"],
            }
            for d in grid.devices
        }
    return list(rows)


def render_table(grid: Grid, rows: list[dict[str, Any]]) -> str:
    from memwarden.units import format_bytes

    header = ["model", "request", "peak", *[d.id for d in grid.devices]]
    body = [
        [
            r["model"],
            r["request"],
            format_bytes(r["peak_bytes"]),
            *[
                ("fits" if r["devices"][d.id]["fits"] else "no")
                + f" ({format_bytes(r['devices'][d.id]['headroom_bytes'])})"
                for d in grid.devices
            ],
        ]
        for r in rows
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in body]
    return "\n".join(line.rstrip() for line in lines) + "\n"
