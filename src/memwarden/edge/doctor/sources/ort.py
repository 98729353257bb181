"""ONNX Runtime: which providers the wheel was built with, and which really start.

``get_available_providers()`` lists providers compiled into the wheel; a provider whose
libraries (CUDA, cuDNN, TensorRT, QNN) do not load is still listed, and a session asked for it
silently runs on CPU. The probe builds a one-node model (Identity, encoded by hand so no
``onnx`` package is needed), opens a session per provider and compares ``get_providers()``;
ORT's own error lines for each attempt come back from stderr.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

from memwarden.edge.doctor.sources._read import read_text

_ASSIGN = re.compile(r"^(\w+)\s*=\s*(?:'([^']*)'|\"([^\"]*)\")", re.M)

PROBE = r"""
import json, sys
import onnxruntime as ort

def varint(n):
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out

def ld(field, payload):
    return varint(field << 3 | 2) + varint(len(payload)) + payload

def vi(field, n):
    return varint(field << 3) + varint(n)

tensor = vi(1, 1) + ld(2, ld(1, vi(1, 1)))  # float, shape [1]
def value(name):
    return ld(1, name) + ld(2, ld(1, tensor))
node = ld(1, b"x") + ld(2, b"y") + ld(4, b"Identity")
graph = ld(1, node) + ld(2, b"probe") + ld(11, value(b"x")) + ld(12, value(b"y"))
model = vi(1, 7) + ld(7, graph) + ld(8, ld(1, b"") + vi(2, 13))

out = {"version": ort.__version__, "device": ort.get_device(), "available": ort.get_available_providers(), "providers": {}}
for provider in out["available"]:
    if provider in ("CPUExecutionProvider", "AzureExecutionProvider"):
        continue
    sys.stderr.write("@@probe " + provider + "\n")
    sys.stderr.flush()
    try:
        session = ort.InferenceSession(model, providers=[provider, "CPUExecutionProvider"])
        out["providers"][provider] = {"starts": provider in session.get_providers()}
    except Exception as exc:
        out["providers"][provider] = {"starts": False, "error": str(exc)[:400]}
print(json.dumps(out))
"""


def static(installed: dict[str, str]) -> dict[str, Any]:
    packages = {name: v for name, v in installed.items() if name == "onnxruntime" or name.startswith("onnxruntime-")}
    try:
        spec = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return (
            {"status": "not present", "packages": packages}
            if not packages
            else {"status": "broken", "packages": packages}
        )
    capi = Path(spec.origin).parent / "capi"
    build: dict[str, str] = {}
    for name in ("build_and_package_info.py", "version_info.py"):
        raw = read_text(capi / name) or ""
        build.update({m.group(1): m.group(2) or m.group(3) for m in _ASSIGN.finditer(raw)})
    try:
        libraries = sorted(p.name for p in capi.glob("*onnxruntime_providers_*"))
    except OSError:
        libraries = []
    return {
        "status": "present",
        "packages": packages,
        "version": build.get("__version__"),
        "package_name": build.get("package_name"),
        "built_with": {k: v for k, v in build.items() if k in ("cuda_version", "cudnn_version")},
        "provider_libraries": libraries,
    }


def _errors_by_provider(stderr: str) -> dict[str, str]:
    out: dict[str, str] = {}
    current = None
    for line in stderr.splitlines():
        if line.startswith("@@probe "):
            current = line.split(" ", 1)[1].strip()
        elif current and ("[E:" in line or "[W:" in line or "Error" in line or "Failed" in line):
            out[current] = (out.get(current, "") + " " + line.strip())[-600:].strip()
    return out


def merge_probe(facts: dict[str, Any], probe: dict[str, Any] | None) -> dict[str, Any]:
    if probe is None:
        return facts | {"probe": "not run"}
    if probe["status"] != "ok":
        return facts | {"probe": probe["status"], "probe_error": probe.get("error")}
    result = probe["result"]
    logged = _errors_by_provider(probe.get("stderr", ""))
    providers = {}
    for name, entry in result.get("providers", {}).items():
        providers[name] = entry | ({"error": logged[name]} if name in logged and "error" not in entry else {})
    return facts | {
        "probe": "ok",
        "version": result.get("version") or facts.get("version"),
        "compiled_providers": result.get("available", []),
        "providers": providers,
    }
