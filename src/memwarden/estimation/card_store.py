"""Estimates kept on disk: an estimate asked again (the same shipped model, request and device, on
the same code, library versions and CPU) answers from the card its meta run made the first time,
without importing torch or transformers or running anything (well under a second, against tens of
seconds for the meta run of a 7B model).

What decides the card, and so goes into the key:

- the request and the device as given (every keyword of ``estimate``; the device profile's every
  field, so an edited TOML is a new key);
- memwarden's own code and data (a digest of every source, config and profile file of the installed
  package), and the versions of torch, transformers and numpy (whose code the meta run runs);
- the CPU: the kernels PyTorch picks and the work buffers they allocate follow the CPU's
  instructions and thread count (``/proc/cpuinfo``'s model and flags, the cores this process may
  use, the thread variables).

Only shipped configs are kept: a local folder or config.json of the user's can change under the
same path. ``--fit``/``--solve`` searches are not kept. ``MEMWARDEN_ESTIMATE_CACHE=off`` turns the
store off; it lives in ``$MEMWARDEN_CACHE/estimates`` (default ``~/.cache/memwarden``), at most
``KEEP`` cards, the oldest dropped first. A card that cannot be read (truncated, from another
version of this format) is a miss, never an error.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

from memwarden.estimation.card import MemoryCard, Request, Suggestion

__all__ = ["KEEP", "enabled", "load_card", "request_key", "save_card"]

FORMAT = 1  # of the stored JSON; a new layout of MemoryCard is a new number
KEEP = 512  # cards kept; each is a few KiB
_PACKAGE = Path(__file__).resolve().parent.parent
_SOURCE_SUFFIXES = (".py", ".json", ".toml", ".cpp")
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def enabled() -> bool:
    return os.environ.get("MEMWARDEN_ESTIMATE_CACHE", "on").strip().lower() not in ("off", "0", "no", "false")


def _directory() -> Path:
    root = Path(os.environ.get("MEMWARDEN_CACHE", Path.home() / ".cache" / "memwarden"))
    return root / "estimates"


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    """Every source, config and device-profile file of the installed package, by path and content."""
    digest = hashlib.sha256()
    for path in sorted(p for p in _PACKAGE.rglob("*") if p.suffix in _SOURCE_SUFFIXES):
        digest.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def _environment() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    versions: dict[str, str | None] = {}
    for name in ("torch", "transformers", "numpy"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    cpu: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                field, _, value = line.partition(":")
                field = field.strip()
                if field in ("model name", "flags", "Features", "CPU implementer", "CPU part") and field not in cpu:
                    cpu[field] = value.strip()
    except OSError:
        pass
    affinity = getattr(os, "sched_getaffinity", None)
    return {
        "code": _code_digest(),
        "versions": versions,
        "machine": platform.machine(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": len(affinity(0)) if affinity is not None else os.cpu_count(),
        "threads": {k: os.environ.get(k) for k in _THREAD_VARIABLES},
    }


def request_key(model: str, settings: dict[str, Any], device: Any) -> str:
    """The key of one estimate: ``settings`` are its keywords (plain values), ``device`` a loaded
    profile or None."""
    fields = {"model": model, "settings": settings, "device": repr(device), "environment": _environment()}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=repr).encode()).hexdigest()


def _to_json(card: MemoryCard) -> dict[str, Any]:
    data = {f.name: getattr(card, f.name) for f in dataclasses.fields(card)}
    data["suggestions"] = [dataclasses.asdict(s) for s in card.suggestions]
    data["request"] = dataclasses.asdict(card.request) if card.request is not None else None
    return data


def _from_json(data: dict[str, Any]) -> MemoryCard:
    names = {f.name for f in dataclasses.fields(MemoryCard)}
    if set(data) != names:
        raise ValueError("a card of another layout")
    data = dict(data)
    data["suggestions"] = [Suggestion(**s) for s in data["suggestions"]]
    request = data["request"]
    if request is not None:
        request = dict(request)
        request["images"] = tuple(tuple(wh) for wh in request["images"])
        request["videos"] = tuple(tuple(whf) for whf in request["videos"])
        data["request"] = Request(**request)
    return MemoryCard(**data)


def load_card(key: str) -> MemoryCard | None:
    """The card kept under ``key``, or None (none kept, or one that cannot be read)."""
    path = _directory() / f"{key}.json"
    try:
        stored = json.loads(path.read_text())
        if stored.get("format") != FORMAT or stored.get("key") != key:
            return None
        return _from_json(stored["card"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def save_card(key: str, card: MemoryCard) -> None:
    """Keep ``card`` under ``key`` (written whole or not at all); a store that cannot be written is
    skipped: the estimate stands without it."""
    directory = _directory()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"format": FORMAT, "key": key, "card": _to_json(card)})
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".card-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, directory / f"{key}.json")
        finally:
            Path(tmp).unlink(missing_ok=True)  # gone already when the replace succeeded
        kept = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for old in kept[: max(0, len(kept) - KEEP)]:
            old.unlink(missing_ok=True)
    except (OSError, TypeError, ValueError):
        return
