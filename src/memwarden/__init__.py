"""memwarden: find, predict and prevent out-of-memory failures of multimodal models."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "BudgetController", "GovernedSession", "Trace", "capture", "estimate", "load", "quantize",
           "save", "summary"]


def __getattr__(name: str) -> Any:
    # Lazy so that `import memwarden` (and the pure analyses) never import torch.
    if name == "capture":
        from memwarden.trace.capture import capture

        return capture
    if name in ("Trace", "load", "save"):
        from memwarden.trace import model

        return getattr(model, name)
    if name == "estimate":
        import importlib

        return importlib.import_module("memwarden.estimate")  # a callable module: memwarden.estimate(...)
    if name == "quantize":
        from memwarden.runtime.quant import quantize

        return quantize
    if name == "GovernedSession":
        from memwarden.runtime.session import GovernedSession

        return GovernedSession
    if name == "BudgetController":
        from memwarden.runtime.budget import BudgetController

        return BudgetController
    if name == "summary":
        from memwarden.analyze.timeline import summary

        return summary
    raise AttributeError(f"module 'memwarden' has no attribute {name!r}")
