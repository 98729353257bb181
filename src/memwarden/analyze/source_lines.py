"""The line to change, read from the user's source: who keeps a value, which argument sized it.

A trace knows where bytes were allocated; the line a user must change often allocates nothing:
the ``append`` or dict insert that keeps a reference to a call's result, the ``x = torch.cat([x,
new])`` that grows an accumulator, the keyword (``num_beams=8``, ``padding="max_length"``,
``max_pixels=...``) that sized the input. These functions follow the value from the line that
made it through the script's own text: the source is parsed with ``ast`` (read as data, size
bounded, never executed) and the names assigned from the call are followed to the statement that
stores them in a container that outlives the loop.

Every function returns ``None`` when the source cannot be read or says nothing certain: a finding
then keeps the allocating line.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "SourceLine", "argument_line", "call_lines", "holding_line", "keeper_line", "read_from", "rebinding_line",
    "script_files",
]  # fmt: skip

_MAX_SOURCE_BYTES = 4 << 20
_STORE_METHODS = frozenset({"append", "extend", "insert", "add", "update", "setdefault", "appendleft", "put"})


@dataclass(frozen=True)
class SourceLine:
    file: str
    line: int
    what: str  # how the line keeps or sizes the value: "list.append", "dict insert", "cat accumulator", ...


_BASES: list[str] = []  # folders relative source paths are resolved against (the traced run's cwd)


def read_from(folder: str | None) -> None:
    """Resolve relative source paths against ``folder`` (a trace's ``metadata["cwd"]``: ``memwarden
    trace`` records the folder the script ran in, and ``diagnose`` may run in another)."""
    _BASES[:] = [folder] if isinstance(folder, str) and folder else []


def _resolve(path: str) -> str:
    if os.path.isabs(path) or not _BASES:
        return path
    candidate = os.path.join(_BASES[0], path)
    return candidate if os.path.isfile(candidate) else path


def _tree(path: str) -> ast.Module | None:
    return _parse(_resolve(path))


@lru_cache(maxsize=64)
def _parse(path: str) -> ast.Module | None:
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > _MAX_SOURCE_BYTES:
            return None
        with open(path, "rb") as fh:
            return ast.parse(fh.read(_MAX_SOURCE_BYTES), filename=path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _enclosing_body(tree: ast.Module, line: int) -> tuple[list[ast.stmt], ast.stmt] | None:
    """The innermost statement list holding the statement at ``line``, and that statement."""
    best: tuple[list[ast.stmt], ast.stmt] | None = None
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        for name in ("body", "orelse", "finalbody", "handlers"):
            body = getattr(node, name, None)
            if not isinstance(body, list):
                continue
            for stmt in body:
                if not isinstance(stmt, ast.stmt):
                    if isinstance(stmt, ast.ExceptHandler):
                        stack.append(stmt)
                    continue
                end = getattr(stmt, "end_lineno", stmt.lineno) or stmt.lineno
                if stmt.lineno <= line <= end:
                    best = (body, stmt)
                    stack.append(stmt)
    return best


def _loop_of(tree: ast.Module, line: int) -> ast.stmt | None:
    """The innermost ``for``/``while`` whose body holds ``line``."""
    found: ast.stmt | None = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
            end = getattr(node, "end_lineno", node.lineno) or node.lineno
            if node.lineno < line <= end and (found is None or node.lineno > found.lineno):
                found = node
    return found


def _names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _uses(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _store_kind(stmt: ast.stmt, names: set[str]) -> str | None:
    """How ``stmt`` keeps one of ``names`` in something that outlives it, or None."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _STORE_METHODS:
            if any(_uses(a, names) for a in [*node.args, *[k.value for k in node.keywords]]):
                return f"{_dotted(node.func.value)}.{node.func.attr}"
    if isinstance(stmt, ast.Assign):
        for target in stmt.targets:
            if isinstance(target, ast.Subscript) and _uses(stmt.value, names):
                return f"{_dotted(target.value)}[...] ="
            if isinstance(target, ast.Name) and _is_cat_of(stmt.value, target.id, names):
                return "cat accumulator"
    if isinstance(stmt, ast.AugAssign) and _uses(stmt.value, names):
        if isinstance(stmt.op, ast.Add) and isinstance(stmt.target, (ast.Name, ast.Attribute, ast.Subscript)):
            return f"{_dotted(stmt.target)} +="
    return None


def _is_cat_of(value: ast.AST, acc: str, names: set[str]) -> bool:
    """``acc = torch.cat([acc, new])`` (or stack/concat/hstack/vstack) with ``new`` among ``names``."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, (ast.Attribute, ast.Name))):
        return False
    fname = value.func.attr if isinstance(value.func, ast.Attribute) else value.func.id
    if fname not in {"cat", "concat", "concatenate", "stack", "hstack", "vstack"} or not value.args:
        return False
    return _uses(value.args[0], {acc})


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Subscript):
        return _dotted(node.value)
    return "…"


def script_files(call_sites: list[str]) -> list[str]:
    """The files of the user's script: those of the lines that called the model (``file:line:fn``)."""
    return list(dict.fromkeys(site.split(":", 1)[0] for site in call_sites if site))


def keeper_line(file: str, line: int) -> SourceLine | None:
    """The statement that keeps the value made at ``file:line`` beyond its loop iteration.

    The value is followed through the names its statement assigns (``out = model.generate(...)``,
    then ``texts = out.sequences``); the first later statement of the same loop body (nested blocks
    included) that appends one of them to a container, inserts it in a dict, adds it to an
    accumulator or concatenates it onto one is the keeper. A statement that stores the call's result
    directly (``outs.append(model(x))``) is its own keeper."""
    tree = _tree(file)
    if tree is None:
        return None
    found = _enclosing_body(tree, line)
    if found is None:
        return None
    body, stmt = found
    names: set[str] = set()
    if (kind := _stores_call(stmt)) is not None:
        return SourceLine(file, stmt.lineno, kind)
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        for t in targets:
            names |= _names(t)
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return None
    if not names:
        return None
    loop = _loop_of(tree, line)
    scope: list[ast.stmt] = getattr(loop, "body", body) if loop is not None else body
    after = False
    for later in _flatten(scope):
        if later is stmt:
            after = True
            continue
        if not after or later.lineno <= stmt.lineno:
            continue
        kind = _store_kind(later, names)
        if kind is not None:
            return SourceLine(file, later.lineno, kind)
        if isinstance(later, ast.Assign) and _uses(later.value, names):  # texts = out.sequences
            for t in later.targets:
                if isinstance(t, ast.Name):
                    names.add(t.id)
    return None


def _stores_call(stmt: ast.stmt) -> str | None:
    """How ``stmt`` stores a call's result directly (``outs.append(model(x))``), or None."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _STORE_METHODS:
            if any(isinstance(n, ast.Call) for a in node.args for n in ast.walk(a)):
                return f"{_dotted(node.func.value)}.{node.func.attr}"
    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
        for target in stmt.targets:
            if isinstance(target, ast.Subscript):
                return f"{_dotted(target.value)}[...] ="
            if isinstance(target, ast.Name) and _is_cat_of(stmt.value, target.id, set()):
                return "cat accumulator"
    return None


def _flatten(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for stmt in body:
        out.append(stmt)
        for name in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, name, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                out.extend(_flatten(inner))
    return out


def argument_line(file: str, line: int, keywords: tuple[str, ...]) -> SourceLine | None:
    """The line in ``file`` that passes one of ``keywords`` (``num_beams=``, ``padding=``,
    ``max_pixels=``...) to a call, nearest at or before ``line`` in the same function, else anywhere
    in the file: where the size of a request is chosen."""
    tree = _tree(file)
    if tree is None:
        return None
    hits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for k in node.keywords:
                if k.arg in keywords:
                    hits.append((getattr(k.value, "lineno", node.lineno), k.arg))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript):
            key = node.targets[0].slice
            if isinstance(key, ast.Constant) and key.value in keywords:
                hits.append((node.lineno, str(key.value)))
    if not hits:
        return None
    before = [h for h in hits if h[0] <= line]
    at, name = max(before) if before else min(hits)
    return SourceLine(file, at, f"{name}=")


def call_lines(file: str, function: str) -> list[SourceLine]:
    """The lines in ``file`` that call ``function`` (by its last name: ``load``, ``obj.load``), in
    source order: where a helper that allocated (a loader the script calls) is asked to."""
    tree = _tree(file)
    if tree is None or not function:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name == function:
                out.append(SourceLine(file, node.lineno, f"{function}(...)"))
    return sorted(out, key=lambda s: s.line)


def rebinding_line(file: str, line: int, depth: int = 4) -> SourceLine | None:
    """The assignment that binds the value made at ``file:line`` to a name that already held one
    (``model = load(...)``, ``self.model = build(...)``): the statement itself when it is such an
    assignment, else, going up through the functions that contain it, the last line of ``file``
    that calls that function, and so on (``depth`` levels)."""
    tree = _tree(file)
    if tree is None:
        return None
    for _ in range(depth):
        found = _enclosing_body(tree, line)
        if found is None:
            return None
        _, stmt = found
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and isinstance(stmt.value, ast.Call):
            return SourceLine(file, stmt.lineno, "rebinds")
        function = _function_of(tree, line)
        if function is None:
            return None
        calls = [c for c in call_lines(file, function) if c.line != line]
        if not calls:
            return None
        line = calls[-1].line
    return None


def holding_line(file: str, line: int, function: str, scripts: list[str], depth: int = 4) -> SourceLine | None:
    """The line of the user's script that asked for the value made at ``file:line`` (in
    ``function``) and keeps it: up through helpers (a ``return helper(...)``, a function of another
    file of the user's folder such as a frame decoder) to the script's calling statement, then that
    statement's keeper (``frames.append(...)``) or the statement itself (``frames = [decode(i) for
    i in ...]``)."""
    for _ in range(depth):
        tree = _tree(file) if file in scripts else None
        found = _enclosing_body(tree, line) if tree is not None else None
        if tree is not None and found is not None and not isinstance(found[1], ast.Return):
            return keeper_line(file, line) or SourceLine(file, found[1].lineno, "keeps")
        if tree is not None:
            function = _function_of(tree, line) or ""
        calls = [c for script in scripts for c in call_lines(script, function) if (c.file, c.line) != (file, line)]
        if not calls:
            return None
        file, line = calls[0].file, calls[0].line
    return None


def _function_of(tree: ast.Module, line: int) -> str | None:
    best: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            end = node.end_lineno or node.lineno
            if node.lineno <= line <= end and (best is None or node.lineno > best.lineno):
                best = node
    return best.name if best is not None else None
