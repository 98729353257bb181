"""Versions of the native libraries a GPU/NPU stack loads, read from files, not by loading them.

cuDNN, the CUDA runtime and TensorRT are found as pip wheels (``nvidia-cudnn-cu12`` ...) and as
versioned shared objects (``libcudnn.so.9.1.0``) on ``LD_LIBRARY_PATH`` and the usual system
directories; ``cudnn_version.h`` gives the exact cuDNN release where a toolkit is installed.
The QNN SDK's version comes from ``QNN_SDK_ROOT`` (its directory is named by version).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from memwarden.edge.doctor.sources._read import read_text

_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/local/cuda/lib64",
    "/usr/lib64",
    "/usr/local/lib",
)
_SONAMES = {
    "cudnn": re.compile(r"^libcudnn\.so\.(\d+(?:\.\d+)*)$"),
    "cudart": re.compile(r"^libcudart\.so\.(\d+(?:\.\d+)*)$"),
    "tensorrt": re.compile(r"^libnvinfer\.so\.(\d+(?:\.\d+)*)$"),
}
_WHEELS = {"cudnn": "nvidia-cudnn", "cudart": "nvidia-cuda-runtime", "tensorrt": "tensorrt"}
_HEADER = re.compile(r"#define CUDNN_(MAJOR|MINOR|PATCHLEVEL)\s+(\d+)")


def _scan(dirs: list[str]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {name: set() for name in _SONAMES}
    for directory in dirs:
        try:
            entries = os.listdir(directory)
        except OSError:
            continue
        for entry in entries:
            for name, pattern in _SONAMES.items():
                if match := pattern.match(entry):
                    found[name].add(match.group(1))
    return found


def _longest(versions: set[str]) -> list[str]:
    # libcudnn.so.9 and libcudnn.so.9.1.0 are the same library: keep the most precise of each major.
    by_major: dict[str, str] = {}
    for v in versions:
        m = v.split(".")[0]
        if len(v) > len(by_major.get(m, "")):
            by_major[m] = v
    return sorted(by_major.values())


def collect(packages: dict[str, str] | None = None) -> dict[str, Any]:
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(_DIRS)
    found = _scan(dirs)
    for name, prefix in _WHEELS.items():
        for dist, version in (packages or {}).items():
            if dist == prefix or (dist.startswith(prefix + "-") and not dist.endswith("-bindings")):
                found[name].add(version)
    header = read_text("/usr/include/cudnn_version.h") or read_text("/usr/local/cuda/include/cudnn_version.h")
    if header and len(parts := dict(_HEADER.findall(header))) == 3:
        found["cudnn"].add(f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCHLEVEL']}")
    out: dict[str, Any] = {"status": "present", **{name: _longest(v) for name, v in found.items()}}
    qnn_root = os.environ.get("QNN_SDK_ROOT")
    if qnn_root:
        match = re.search(r"(\d+\.\d+\.\d+)", Path(qnn_root).name) or re.search(r"(\d+\.\d+\.\d+)", qnn_root)
        out["qnn_sdk"] = match.group(1) if match else "unknown"
    return out
