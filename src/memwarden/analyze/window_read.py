"""Whether a script reads only the newest few items of a container it keeps appending to.

A live-camera captioner appends every frame's features to ``context`` and reads
``context[-2:]``; a chat keeps every turn in ``history`` and sends ``history[-6:]``. What each
item carries is needed; what is not is every item before the window. That is unbounded growth
(bound the container: ``collections.deque(maxlen=2)``), not a result kept with too much in it.
The script's own source says which: the container is read through a trailing slice of a fixed
size (``name[-K:]``, ``list(name)[-K:]``). Read as data with ``ast``; nothing is executed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from memwarden.analyze.source_lines import function_node, statement_at, tree_of

__all__ = ["Window", "window_read"]

_APPENDS = frozenset({"append", "extend", "insert", "appendleft"})


@dataclass(frozen=True)
class Window:
    file: str
    container: str  # the container's name as the script writes it (``context``, ``self.history``)
    size: str  # the window as the script writes it: ``2``, ``WINDOW``
    items: int | None  # its value, when a literal or a module-level constant says it
    binding_line: int  # where the container is made (``context = []``): where a bound is set
    read_line: int  # the statement that reads the window


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _appended_to(stmt: ast.stmt) -> str | None:
    """The container a statement appends to (``context.append(x)``, ``context += [x]``)."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _APPENDS:
            return _dotted(node.func.value)
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add):
        return _dotted(stmt.target)
    return None


def _trailing_size(node: ast.Subscript, container: str) -> str | None:
    """``K`` when ``node`` is ``container[-K:]`` or ``list(container)[-K:]`` (also tuple, deque)."""
    value = node.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and len(value.args) == 1:
        value = value.args[0]
    if _dotted(value) != container:
        return None
    cut = node.slice
    if not isinstance(cut, ast.Slice) or cut.upper is not None or cut.step is not None:
        return None
    lower = cut.lower
    if isinstance(lower, ast.UnaryOp) and isinstance(lower.op, ast.USub):
        return ast.unparse(lower.operand)
    return None


def _binding_line(scope: ast.AST, container: str, before: int) -> int | None:
    """The last statement before line ``before`` that makes the container (``name = []``)."""
    best = None
    for node in ast.walk(scope):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.lineno < before:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_dotted(t) == container for t in targets) and node.value is not None:
                if isinstance(node.value, (ast.List, ast.Dict, ast.Call, ast.ListComp, ast.Tuple)):
                    best = node.lineno if best is None or node.lineno > best else best
    return best


def _value(tree: ast.Module, size: str) -> int | None:
    """``size`` as a number: a literal, or a module-level ``NAME = <int>``."""
    if size.isdigit():
        return int(size)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == size for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
                return int(node.value.value)
    return None


def _class_of(tree: ast.Module, line: int) -> ast.ClassDef | None:
    """The innermost class whose body holds ``line``."""
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.lineno <= line <= (node.end_lineno or node.lineno):
            best = node if best is None or node.lineno > best.lineno else best
    return best


def window_read(file: str, line: int) -> Window | None:
    """The window the script reads of the container the statement at ``file:line`` appends to,
    or None when it appends to none or reads it otherwise (whole, by index, not at all)."""
    tree = tree_of(file)
    stmt = statement_at(tree, line) if tree is not None else None
    if tree is None or stmt is None:
        return None
    container = _appended_to(stmt)
    if container is None:
        return None
    scope: ast.AST = function_node(tree, line) or tree
    if container.startswith("self."):  # an attribute: read by any method of its class
        scope = _class_of(tree, line) or scope
    for node in ast.walk(scope):
        if isinstance(node, ast.Subscript):
            size = _trailing_size(node, container)
            if size is not None:
                read = statement_at(tree, node.lineno)
                bound = _binding_line(scope, container, line)
                if bound is None and container.startswith("self."):
                    bound = _binding_line(tree, container, 1 << 30)  # set in __init__
                return Window(
                    file,
                    container,
                    size,
                    _value(tree, size),
                    bound or stmt.lineno,
                    read.lineno if read else node.lineno,
                )
    return None
