"""torch's version and CUDA build from ``torch/version.py`` (no import); cuDNN and the GPU as
the loaded library reports them, from a probe, only when torch was built with CUDA."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

from memwarden.edge.doctor.sources._read import read_text

_ASSIGN = re.compile(r"^(__version__|cuda|hip)\s*(?::[^=]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", re.M)

PROBE = """
import json
import torch
out = {"cuda_available": torch.cuda.is_available(), "cuda": torch.version.cuda}
try:
    out["cudnn"] = torch.backends.cudnn.version()
except Exception as exc:
    out["cudnn_error"] = str(exc)[:400]
out["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
print(json.dumps(out))
"""


def static() -> dict[str, Any]:
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return {"status": "not present"}
    raw = read_text(Path(spec.origin).parent / "version.py") or ""
    values = {m.group(1): (m.group(2) or m.group(3)) for m in _ASSIGN.finditer(raw)}
    return {
        "status": "present",
        "version": values.get("__version__"),
        "cuda": values.get("cuda"),
        "hip": values.get("hip"),
    }


def merge_probe(facts: dict[str, Any], probe: dict[str, Any] | None) -> dict[str, Any]:
    if probe is None:
        why = "not needed: CPU build" if facts.get("status") == "present" and not facts.get("cuda") else "not run"
        return facts | {"probe": why}
    if probe["status"] != "ok":
        return facts | {"probe": probe["status"], "probe_error": probe.get("error")}
    result = probe["result"]
    return facts | {"probe": "ok", **{k: result.get(k) for k in ("cuda_available", "cudnn", "cudnn_error", "devices")}}
