"""Installed Python distributions that matter on an edge box, from package metadata only.

Importing them would take seconds (torch) or load native libraries; ``importlib.metadata``
reads the ``*.dist-info`` files. Several ``onnxruntime*`` distributions at once is itself a
finding: they install into the same ``onnxruntime`` import package and overwrite each other.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any

_WANTED = re.compile(
    r"^(torch|torchaudio|torchvision|transformers|numpy|onnx|onnxruntime.*|openvino.*|tensorrt.*|mediapipe|"
    r"coremltools|nvidia-cudnn.*|nvidia-cuda-runtime.*|nvidia-cublas.*|qai-hub.*|jetson-stats|soxr|sounddevice|"
    r"pyaudio|pynvml|nvidia-ml-py)$"
)


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def collect() -> dict[str, Any]:
    installed: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = normalise(dist.metadata["Name"] or "")
        if name and _WANTED.match(name):
            installed[name] = dist.version or "unknown"
    return {"status": "present", "installed": dict(sorted(installed.items()))}
