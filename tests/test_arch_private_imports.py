"""No module imports another module's private name (issue 40).

A leading underscore says "this module's own": ``from memwarden.x import _helper`` in another
module couples the two through a name either may change without a word. A name two modules share
is public where it is defined. The one form allowed: a package's private submodule imported by a
module of that same package (``from memwarden.a.b import _shared`` inside ``memwarden/a/b/``),
since a private submodule is private to its package, not to itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC / "memwarden"

# Offenders known and left for their owners, each as "path: from X import _name". Empty: when this
# test was written none was left anywhere (analyze/ and record/ included), so any new one fails it.
ALLOWED: frozenset[str] = frozenset()


def _package_of(path: Path) -> str:
    """The dotted name of the package the module at ``path`` belongs to (a package's own for its
    ``__init__.py``)."""
    return ".".join(path.relative_to(SRC).parent.parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_submodule(package: str, name: str) -> bool:
    folder = SRC.joinpath(*package.split("."))
    return (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file()


def _absolute(module: str | None, level: int, package: str) -> str:
    if not level:
        return module or ""
    base = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join([*base, module] if module else base)


def offenders(code: str, package: str, where: str) -> list[str]:
    """The imports in ``code`` (a module of ``package``, named ``where`` in messages) of a name
    private to another module."""
    found = []
    for node in ast.walk(ast.parse(code, filename=where)):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _absolute(node.module, node.level, package)
        if source != "memwarden" and not source.startswith("memwarden."):
            continue
        for alias in node.names:
            if not _is_private(alias.name):
                continue
            if source == package and _is_submodule(source, alias.name):
                continue  # the package's own private submodule, used inside the package
            found.append(f"{where}: from {source} import {alias.name}")
    return found


def private_imports() -> list[str]:
    """Every import under src/memwarden of a name private to another module."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        found += offenders(path.read_text(encoding="utf-8"), _package_of(path), path.relative_to(SRC).as_posix())
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    found = private_imports()
    new = sorted(set(found) - ALLOWED)
    assert not new, "private names imported from another module (make them public where defined):\n" + "\n".join(new)
    gone = sorted(ALLOWED - set(found))
    assert not gone, "fixed, so drop from ALLOWED:\n" + "\n".join(gone)


def test_the_check_tells_a_private_name_from_a_packages_private_submodule() -> None:
    code = (
        "from memwarden.runtime.offload import _Slot\n"
        "from memwarden.edge.doctor.sources import _read\n"
        "from . import _read as again\n"
        "from memwarden.units import __all__, format_bytes\n"
    )
    inside = offenders(code, "memwarden.edge.doctor.sources", "x.py")
    assert inside == ["x.py: from memwarden.runtime.offload import _Slot"]
    outside = offenders(code, "memwarden.edge.doctor", "y.py")
    assert outside == [
        "y.py: from memwarden.runtime.offload import _Slot",
        "y.py: from memwarden.edge.doctor.sources import _read",
        "y.py: from memwarden.edge.doctor import _read",
    ]
