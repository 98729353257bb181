"""The layering of DESIGN.md, enforced: analyses and planners never import torch; the
package's public surface is explicit."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import memwarden
import memwarden.analyze
import memwarden.analyze.patterns
import memwarden.plan


def _modules(package) -> list[str]:
    return [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]


def test_analyze_and_plan_do_not_import_torch() -> None:
    names = _modules(memwarden.analyze) + _modules(memwarden.plan) + ["memwarden.trace.model", "memwarden.report.html"]
    code = (
        "import sys\n"
        + "".join(f"import {n}\n" for n in names)
        + "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"torch imported by {names}"


def test_trace_model_imports_nothing_of_memwarden() -> None:
    code = "import sys, memwarden.trace.model\nprint(sorted(m for m in sys.modules if m.startswith('memwarden.') and m not in ('memwarden.trace', 'memwarden.trace.model')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_public_surface() -> None:
    assert set(memwarden.__all__) >= {"capture", "Trace", "load", "save", "summary"}
    for name in memwarden.__all__:
        assert getattr(memwarden, name) is not None
