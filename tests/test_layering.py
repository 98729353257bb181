"""The architecture of docs/architecture.md, enforced by walking the source.

The import graph is read from the source (``ast``), lazy imports inside functions included;
imports under ``if TYPE_CHECKING:`` are left out because they never run. The checks:

- no module import cycle and no package import cycle;
- every package imports only packages below it in ``LAYERS``;
- ``trace``, ``interop``, ``plan``, ``analyze``, ``govern``, ``report``, ``edge`` and ``align``
  never import torch, directly or through another memwarden module;
- every ``from memwarden.x import name`` names the module that defines ``name`` (no shims);
- no module over ``MAX_LINES`` lines, none that only re-exports, no private name re-exported;
- ``memwarden.__all__`` is pinned in full, and every name in it is real.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

import memwarden

SRC = Path(memwarden.__file__).resolve().parent
MAX_LINES = 500

# Lowest first. A package may import packages of a lower rank only (and the base modules).
LAYERS: list[set[str]] = [
    {"errors", "units", "html_page"},
    {"untrusted"},  # readers of untrusted input: errors below
    {"trace"},
    {"models"},
    {"interop"},
    {"record", "plan", "govern", "edge", "align"},
    {"analyze"},
    {"estimation"},
    {"runtime"},
    {"resilience"},
    {"report"},
    {"(api)"},  # memwarden/__init__.py: the public surface
    {"demo", "testing"},  # testing: the pytest plugin (captures, checks, renders)
    {"commands"},
    {"cli"},
    {"__main__"},
]
TORCH_FREE = {
    "trace",
    "interop",
    "plan",
    "analyze",
    "govern",
    "report",
    "edge",
    "align",
    "errors",
    "units",
    "html_page",
    "untrusted",
}
PUBLIC_API = [
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


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, name: str, is_package: bool) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append(child)
            visit(child)

    visit(tree)
    return found


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


@cache
def graph() -> dict[str, set[str]]:
    """module -> memwarden modules (and 'torch') it imports at run time."""
    mods = modules()
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        out: set[str] = set()
        is_pkg = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text()), name, is_pkg):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = _absolute(node, name, is_pkg)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                if target == "torch" or target.startswith("torch.") or target == "transformers":
                    out.add("torch")
                elif target.startswith("memwarden"):
                    while target not in mods and "." in target:
                        target = target.rsplit(".", 1)[0]
                    out.add(target)
        out.discard(name)
        edges[name] = out
    return edges


def package_of(module: str) -> str:
    parts = module.split(".")
    return "(api)" if len(parts) == 1 else parts[1]


def _rank(package: str) -> int:
    for i, layer in enumerate(LAYERS):
        if package in layer:
            return i
    raise AssertionError(f"package {package!r} is in no layer of LAYERS; add it")


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            connect(v)
    return found


def test_the_walker_sees_lazy_imports_and_skips_type_checking() -> None:
    # The walker itself must see what these rules are about, or every check below passes vacuously.
    edges = graph()
    assert "memwarden.record.live.capture" in edges["memwarden.record.api"]  # a lazy import in a function
    assert "torch" not in edges["memwarden.record.api"]  # only under TYPE_CHECKING / lazily through the recorder
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_no_module_import_cycle() -> None:
    assert _cycles(graph()) == []


def test_no_package_import_cycle() -> None:
    packages: dict[str, set[str]] = {}
    for module, targets in graph().items():
        packages.setdefault(package_of(module), set()).update(
            package_of(t) for t in targets if t != "torch" and package_of(t) != package_of(module)
        )
    assert _cycles(packages) == []


def test_packages_import_only_lower_layers() -> None:
    wrong = []
    for module, targets in graph().items():
        mine = package_of(module)
        for target in targets - {"torch"}:
            theirs = package_of(target)
            if theirs != mine and _rank(theirs) >= _rank(mine):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_torch_free_packages_never_reach_torch() -> None:
    edges = graph()

    def reaches_torch(module: str, seen: set[str]) -> bool:
        if module in seen:
            return False
        seen.add(module)
        return any(t == "torch" or (t in edges and reaches_torch(t, seen)) for t in edges[module])

    offenders = [m for m in edges if package_of(m) in TORCH_FREE and reaches_torch(m, set())]
    assert offenders == []


def test_importing_memwarden_and_the_pure_packages_loads_no_torch() -> None:
    names = [m for m in modules() if package_of(m) in TORCH_FREE] + ["memwarden"]
    code = "import sys\n" + "".join(f"import {n}\n" for n in names)
    code += "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _defined_and_imported(path: Path) -> tuple[set[str], dict[str, tuple[str, str]]]:
    tree = ast.parse(path.read_text())
    defined: set[str] = set()
    imported: dict[str, tuple[str, str]] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Assign):
                defined.update(n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defined.add(node.target.id)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.update({a.asname or a.name: (node.module, a.name) for a in node.names})
            elif isinstance(node, ast.If) and not _is_type_checking(node):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)

    visit(tree.body)
    return defined, imported


def _python_files() -> list[Path]:
    root = SRC.parent.parent
    return sorted(p for d in ("src", "tests", "benchmarks", "examples") for p in (root / d).rglob("*.py"))


def test_every_import_names_the_defining_module() -> None:
    mods = modules()
    info = {name: _defined_and_imported(path) for name, path in mods.items()}
    wrong = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("memwarden.")):
                continue
            if node.level or node.module not in info:
                continue
            defined, _ = info[node.module]
            for alias in node.names:
                if alias.name not in defined and f"{node.module}.{alias.name}" not in mods:
                    wrong.append(f"{path.name}:{node.lineno}: {node.module}.{alias.name}")
    # The public surface (memwarden/__init__.py) is the one place that gathers names.
    assert wrong == []


def test_no_module_over_the_line_budget() -> None:
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_module_only_reexports_and_no_private_name_is_reexported() -> None:
    only_reexports, private = [], []
    for name, path in modules().items():
        if name == "memwarden":
            continue
        tree = ast.parse(path.read_text())
        body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        imports_only = all(
            isinstance(n, ast.Import | ast.ImportFrom)
            or (isinstance(n, ast.Assign) and [getattr(t, "id", "") for t in n.targets] == ["__all__"])
            for n in body
        )
        if body and imports_only and any(isinstance(n, ast.ImportFrom) for n in body):
            only_reexports.append(name)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("memwarden"):
                private += [f"{name}: {a.name} as {a.asname}" for a in node.names if a.asname == a.name]
    assert only_reexports == []
    assert private == []  # `import x as x` is the re-export idiom


def test_public_surface_is_pinned_and_real() -> None:
    assert memwarden.__all__ == PUBLIC_API
    for name in memwarden.__all__:
        assert getattr(memwarden, name) is not None, name
    assert callable(memwarden.capture) and callable(memwarden.estimate)


def test_every_module_is_reachable_by_attribute_from_its_package() -> None:
    # `import memwarden.<package>.<module>` then `memwarden.<package>.<module>` is that module, for
    # every module: no public function (memwarden.capture, memwarden.estimate) or re-exported name
    # shadows a package or module of the same name. Checked after all are imported, in a fresh
    # interpreter, so no import order can rebind a name afterwards.
    code = (
        "import importlib, pkgutil, sys, memwarden\n"
        "names = [m.name for m in pkgutil.walk_packages(memwarden.__path__, 'memwarden.')\n"
        "         if not m.name.endswith('__main__')]\n"
        "for n in names: importlib.import_module(n)\n"
        "for n in names:\n"
        "    obj = memwarden\n"
        "    for part in n.split('.')[1:]: obj = getattr(obj, part, None)\n"
        "    if obj is not sys.modules[n]: print('SHADOWED', n, type(obj).__name__)\n"
        "print('checked', *names)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "SHADOWED" not in out, out
    checked = set(out.split("checked", 1)[1].split())
    # every module of every package was walked (walk_packages skips a package it cannot import)
    assert checked == {m for m in modules() if m != "memwarden" and not m.endswith("__main__")}


def test_package_subpackages_do_not_shadow_the_functions() -> None:
    # memwarden.capture and memwarden.estimate are functions; their packages are record/ and
    # estimation/, so importing those submodules after `import memwarden` cannot rebind the names.
    code = (
        "import memwarden\n"
        "from memwarden.record.meta import capture as meta\n"
        "from memwarden.estimation import card\n"
        "print(callable(memwarden.capture), callable(memwarden.estimate))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]


@pytest.mark.parametrize("name", ["GovernedSession", "SessionConfig", "quantize", "capture_onnx"])
def test_lazy_names_resolve_to_their_defining_module(name: str) -> None:
    value = getattr(memwarden, name)
    assert value.__module__.startswith(("memwarden.runtime.", "memwarden.record.onnx."))


def _all_imports(path: Path, name: str) -> list[tuple[ast.ImportFrom, str, bool]]:
    """Every ``from memwarden... import`` in the module, lazy ones included: (node, absolute module,
    under ``if TYPE_CHECKING``)."""
    is_pkg = path.name == "__init__.py"
    found: list[tuple[ast.ImportFrom, str, bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for inner in child.body:
                    visit_one(inner, True)
                for inner in child.orelse:
                    visit_one(inner, typing_only)
                continue
            visit_one(child, typing_only)

    def visit_one(child: ast.AST, typing_only: bool) -> None:
        if isinstance(child, ast.ImportFrom):
            base = _absolute(child, name, is_pkg)
            if base.startswith("memwarden"):
                found.append((child, base, typing_only))
        visit(child, typing_only)

    visit(ast.parse(path.read_text()), False)
    return found


def test_no_private_name_imported_from_another_module() -> None:
    """A ``_name`` is its module's own: another module importing it couples to an internal (a
    private submodule, ``from pkg import _read``, is a module and is fine)."""
    mods = modules()
    wrong = []
    for name, path in mods.items():
        for node, base, _typing in _all_imports(path, name):
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and f"{base}.{alias.name}" not in mods:
                    wrong.append(f"{name}: from {base} import {alias.name}")
    assert wrong == []


def test_no_import_cycle_through_type_checking_imports() -> None:
    """Imports under ``if TYPE_CHECKING`` never run, but a cycle through them is still a cycle in
    the design: the types of one module would depend on the other's and back."""
    mods = modules()
    edges = {m: set(targets) - {"torch"} for m, targets in graph().items()}
    for name, path in mods.items():
        for node, base, typing_only in _all_imports(path, name):
            if typing_only:
                for alias in node.names:
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base
                    while target not in mods and "." in target:
                        target = target.rsplit(".", 1)[0]
                    if target != name:
                        edges[name].add(target)
    assert _cycles(edges) == []
