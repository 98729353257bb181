"""memwarden: find, predict and prevent out-of-memory failures of multimodal models.

``import memwarden`` does not import torch: the names that need it (``GovernedSession``,
``SessionConfig``, ``quantize``) load on first use, and ``capture``/``estimate`` import their
torch-side modules when called. Type checkers see every name with its real type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memwarden.analyze.diagnose import diagnose
from memwarden.analyze.timeline import summary
from memwarden.estimation.card import MemoryCard
from memwarden.estimation.run import estimate
from memwarden.govern.budget import BudgetController
from memwarden.interop.files import load_any as load
from memwarden.record.api import capture, flush, ring_stats
from memwarden.report.full import write_report
from memwarden.trace.io import save
from memwarden.trace.model import Trace

if TYPE_CHECKING:
    from memwarden.record.onnx.capture import capture_onnx
    from memwarden.runtime.quant import quantize
    from memwarden.runtime.session import GovernedSession
    from memwarden.runtime.session_config import SessionConfig

__version__ = "0.1.0"

__all__ = [
    "BudgetController",
    "GovernedSession",
    "MemoryCard",
    "SessionConfig",
    "Trace",
    "__version__",
    "capture",
    "capture_onnx",
    "diagnose",
    "estimate",
    "flush",
    "load",
    "quantize",
    "ring_stats",
    "save",
    "summary",
    "write_report",
]

_LAZY = {
    "capture_onnx": "memwarden.record.onnx.capture",
    "GovernedSession": "memwarden.runtime.session",
    "SessionConfig": "memwarden.runtime.session_config",
    "quantize": "memwarden.runtime.quant",
}


def __getattr__(name: str) -> Any:
    # PEP 562: the torch-side names load on first use (see the module docstring); memwarden.align
    # (the sensor-stream aligner, a package) on first use too.
    if name == "align":
        import importlib

        return importlib.import_module("memwarden.align")
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'memwarden' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"align"})
