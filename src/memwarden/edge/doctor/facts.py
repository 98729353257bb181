"""Collect an environment's facts, and move them as JSON between a device and anywhere else.

``collect`` never raises for the environment: each source that fails becomes
``{"status": "error", "error": ...}``. ``load`` validates a facts file someone hands over and
turns every problem into one ``InputError``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from memwarden.edge.doctor import pipeline as pipeline_config
from memwarden.edge.doctor import untrusted_json
from memwarden.edge.doctor.sources import (
    audio,
    caches,
    jetson,
    libraries,
    memory,
    nvidia,
    ort,
    packages,
    platform_facts,
    probes,
    thermal,
    torch_facts,
    video,
)
from memwarden.errors import InputError
from memwarden.trace.io import atomic_write
from memwarden.untrusted import terminal_safe

SCHEMA = "memwarden-doctor-facts/1"
SECTIONS = (
    "platform",
    "packages",
    "torch",
    "onnxruntime",
    "libraries",
    "nvidia",
    "jetson",
    "audio",
    "video",
    "memory",
    "thermal",
    "caches",
    "env",
    "pipeline",
)
_ENV = (
    "CUDA_PATH",
    "CUDA_HOME",
    "LD_LIBRARY_PATH",
    "QNN_SDK_ROOT",
    "ORT_TENSORRT_ENGINE_CACHE_ENABLE",
    "CUDA_VISIBLE_DEVICES",
)


def _guard(name: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # a source must never take the doctor down: the failure is the fact
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:300], "source": name}


def collect(
    *,
    pipeline: str | Path | None = None,
    cache_dirs: tuple[str, ...] = (),
    probe: bool = True,
    probe_timeout_s: float = 5.0,
) -> dict[str, Any]:
    """Every fact this machine offers; probes (subprocesses) only where a library must be loaded."""
    started = time.perf_counter()
    pkgs = _guard("packages", packages.collect)
    installed = pkgs.get("installed", {}) if isinstance(pkgs, dict) else {}
    torch_static = _guard("torch", torch_facts.static)
    ort_static = _guard("onnxruntime", ort.static, installed)
    scripts = {}
    if probe and torch_static.get("status") == "present" and torch_static.get("cuda"):
        scripts["torch"] = torch_facts.PROBE
    if probe and ort_static.get("status") == "present":
        scripts["onnxruntime"] = ort.PROBE
    results = _guard("probes", probes.run, scripts, probe_timeout_s) if scripts else {}
    facts: dict[str, Any] = {
        "schema": SCHEMA,
        "platform": _guard("platform", platform_facts.collect),
        "packages": pkgs,
        "torch": torch_facts.merge_probe(torch_static, results.get("torch")),
        "onnxruntime": ort.merge_probe(ort_static, results.get("onnxruntime"))
        if ort_static.get("status") == "present"
        else ort_static,
        "libraries": _guard("libraries", libraries.collect, installed),
        "nvidia": _guard("nvidia", nvidia.collect),
        "jetson": _guard("jetson", jetson.collect),
        "audio": _guard("audio", audio.collect),
        "video": _guard("video", video.collect),
        "memory": _guard("memory", memory.collect),
        "thermal": _guard("thermal", thermal.collect),
        "caches": _guard("caches", caches.collect, tuple(cache_dirs)),
        "env": {k: os.environ[k] for k in _ENV if k in os.environ},
        "pipeline": pipeline_config.read(pipeline) if pipeline else None,
    }
    facts["collect_s"] = round(time.perf_counter() - started, 3)
    return facts


def dump(facts: dict[str, Any], path: str | Path) -> Path:
    return atomic_write(path, (json.dumps(facts, indent=2, sort_keys=True) + "\n").encode())


MAX_FACTS_BYTES = 16 << 20  # a real facts file is a few KiB; a scenario file as much


def load(path: str | Path) -> dict[str, Any]:
    """A facts file (from ``--collect`` or written by hand for a scenario), validated: a regular file
    of at most ``MAX_FACTS_BYTES``, JSON within ``untrusted_json``'s limits, the schema and sections."""
    facts = untrusted_json.read(path, MAX_FACTS_BYTES, what="a facts file")
    label = terminal_safe(path)
    if not isinstance(facts, dict) or facts.get("schema") != SCHEMA:
        raise InputError(f'{label}: not a facts file (expected a JSON object with "schema": "{SCHEMA}")')
    for section in SECTIONS:
        value = facts.get(section)
        expected = list if section == "caches" else dict
        if value is not None and not isinstance(value, expected):
            raise InputError(f"{label}: section {section!r} must be a JSON {'array' if expected is list else 'object'}")
    return facts
