"""Engine and execution-provider caches, and the versions they were built by.

Compiled caches outlive upgrades: a TensorRT engine only loads in the TensorRT it was built with,
and ORT's CoreML cache is keyed by the model alone, not by the ORT version that compiled it.
Directories come from ORT's environment variables and ``--cache-dir``. The builder's version is
known when the cache records it (a ``built_by.json`` beside the files, or a version-named
directory, the layout ORT's own issue tracker recommends); otherwise a cache whose newest file
predates the installation of the runtime that would load it is marked ``older_than_runtime``.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import os
import re
from pathlib import Path
from typing import Any

from memwarden.edge.doctor import untrusted_json
from memwarden.edge.doctor.sources._read import read_text
from memwarden.errors import InputError

_ENV_DIRS = ("ORT_TENSORRT_CACHE_PATH", "ORT_TENSORRT_ENGINE_CACHE_PATH", "ORT_TENSORRT_TIMING_CACHE_PATH")
_KINDS = (("tensorrt", (".engine", ".trt", ".plan")), ("coreml", (".mlmodelc", ".mlpackage")), ("openvino", (".blob",)))
_RUNTIME_PACKAGE = {"tensorrt": ("tensorrt", "onnxruntime-gpu"), "coreml": ("onnxruntime",), "openvino": ("openvino",)}
_VERSION_DIR = re.compile(r"^(?:(ort|onnxruntime|trt|tensorrt|openvino)[-_]?)?v?(\d+\.\d+(?:\.\d+)*)$", re.I)


def _installed_at(kind: str) -> float | None:
    for name in _RUNTIME_PACKAGE.get(kind, ()):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        record = dist.locate_file(f"{dist.metadata['Name']}-{dist.version}.dist-info")
        try:
            return os.stat(str(record)).st_mtime
        except OSError:
            return None
    return None


def _describe(path: Path) -> dict[str, Any] | None:
    try:
        entries = list(itertools.islice(path.rglob("*"), 10000))  # a huge tree is cut, not listed in full
    except OSError:
        return None
    kind = next((k for k, suffixes in _KINDS if any(e.name.endswith(suffixes) for e in entries)), None)
    if kind is None:
        return None
    built_by: dict[str, str] = {}
    sidecar = path / "built_by.json"
    raw = read_text(sidecar, 1 << 20)  # None for a FIFO or device planted under the name
    try:
        data = untrusted_json.loads(raw) if raw else {}
        built_by.update({str(k)[:100]: str(v)[:100] for k, v in data.items()} if isinstance(data, dict) else {})
    except InputError:
        pass
    for part in path.parts:
        if match := _VERSION_DIR.match(part):
            runtime = {"ort": "onnxruntime", "trt": "tensorrt", None: "onnxruntime" if kind == "coreml" else kind}
            key = (match.group(1) or "").lower() or None
            built_by.setdefault(runtime.get(key, key or kind), match.group(2))
    newest = max((e.stat().st_mtime for e in entries if e.is_file()), default=None)
    installed = _installed_at(kind)
    return {
        "kind": kind,
        "path": str(path),
        "files": sum(1 for e in entries if e.is_file()),
        "built_by": built_by,
        "older_than_runtime": None if newest is None or installed is None else newest < installed,
    }


def collect(extra_dirs: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    dirs = [os.environ[v] for v in _ENV_DIRS if os.environ.get(v)] + list(extra_dirs)
    found = []
    for directory in dict.fromkeys(dirs):
        path = Path(directory)
        if path.is_dir() and (entry := _describe(path)):
            found.append(entry)
    return found
