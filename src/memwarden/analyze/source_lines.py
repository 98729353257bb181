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
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "SourceLine",
    "bound_names",
    "call_lines",
    "enclosing_body",
    "flatten",
    "callable_name",
    "entry_files",
    "function_node",
    "handler_line",
    "holding_line",
    "keeper_line",
    "read_from",
    "rebinding_line",
    "script_files",
    "store_kind",
    "script_line",
    "statement_at",
    "tree_of",
]

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


def tree_of(path: str) -> ast.Module | None:
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


def enclosing_body(tree: ast.Module, line: int) -> tuple[list[ast.stmt], ast.stmt] | None:
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


def bound_names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _uses(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


# Methods whose result is the value itself or a same-size copy of it (a view, a detached or moved
# tensor): storing ``out.logits.detach().cpu()`` keeps the logits; ``.item()``, ``.argmax()`` or a
# call of the user's (``align(out)``) make something else.
_KEEPING_METHODS = frozenset(
    {
        "detach",
        "cpu",
        "to",
        "clone",
        "contiguous",
        "float",
        "half",
        "bfloat16",
        "double",
        "view",
        "reshape",
        "squeeze",
        "unsqueeze",
        "permute",
        "transpose",
        "flatten",
        "numpy",
        "copy",
        "values",
        "items",
    }
)
_KEEPING_FUNCTIONS = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack", "list", "tuple", "dict"})


def _refers(node: ast.AST, names: set[str], items: bool = True) -> bool:
    """Whether ``node`` evaluates to one of ``names``' values, a part of one (an attribute, an
    item), a view or same-size copy of one, or a container holding such: what keeps its bytes.
    ``items=False``: an item (``frames[0]``) is not the whole."""
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Subscript) and not items:
        return False
    if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        return _refers(node.value, names, items)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_refers(x, names, items) for x in node.elts)
    if isinstance(node, ast.Dict):
        return any(v is not None and _refers(v, names, items) for v in node.values)
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in _KEEPING_METHODS:
            return _refers(f.value, names, items)
        fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if fname in _KEEPING_FUNCTIONS:
            return any(_refers(a, names, items) for a in [*node.args, *[k.value for k in node.keywords]])
    return False


def store_kind(stmt: ast.stmt, names: set[str], used: Callable[[ast.AST, set[str]], bool] = _refers) -> str | None:
    """How ``stmt`` keeps one of ``names`` in something that outlives it, or None. ``used`` says
    what keeping is: ``_refers`` (the value, a part or a same-size copy: the default) or ``_uses``
    (anything computed from it)."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _STORE_METHODS:
            if any(used(a, names) for a in [*node.args, *[k.value for k in node.keywords]]):
                return f"{_dotted(node.func.value)}.{node.func.attr}"
    if isinstance(stmt, ast.Assign):
        for target in stmt.targets:
            if isinstance(target, ast.Subscript) and used(stmt.value, names):
                return f"{_dotted(target.value)}[...] ="
            if isinstance(target, ast.Name) and _is_cat_of(stmt.value, target.id, names):
                return "cat accumulator"
            if isinstance(target, ast.Name) and _is_sum_of(stmt.value, target.id, names, used):
                return f"{target.id} = {target.id} +"
    if isinstance(stmt, ast.AugAssign) and used(stmt.value, names) and not isinstance(stmt.value, ast.Compare):
        if isinstance(stmt.op, ast.Add) and isinstance(stmt.target, (ast.Name, ast.Attribute, ast.Subscript)):
            return f"{_dotted(stmt.target)} +="
    return None


def _is_sum_of(value: ast.AST, acc: str, names: set[str], used: Callable[[ast.AST, set[str]], bool]) -> bool:
    """``acc = acc + new`` (either order) with ``new`` among ``names``: ``acc += new`` written out."""
    if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
        return False
    for mine, other in ((value.left, value.right), (value.right, value.left)):
        if isinstance(mine, ast.Name) and mine.id == acc and used(other, names):
            return True
    return False


def _is_cat_of(value: ast.AST, acc: str, names: set[str]) -> bool:
    """``acc = torch.cat([acc, new])`` (or stack/concat/hstack/vstack) with ``new`` among ``names``."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, (ast.Attribute, ast.Name))):
        return False
    fname = value.func.attr if isinstance(value.func, ast.Attribute) else value.func.id
    if fname not in {"cat", "concat", "concatenate", "stack", "hstack", "vstack"} or not value.args:
        return False
    first = value.args[0]
    if not isinstance(first, (ast.List, ast.Tuple)) or not _uses(first, {acc}):
        return False  # `index = torch.cat(index)` joins a list once: no accumulator
    new = [x for x in first.elts if not (isinstance(x, ast.Name) and x.id == acc)]
    return (
        any(_uses(x, names) for x in new) if names else any(isinstance(n, ast.Call) for x in new for n in ast.walk(x))
    )


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
    tree = tree_of(file)
    if tree is None:
        return None
    found = enclosing_body(tree, line)
    if found is None:
        return None
    body, stmt = found
    names: set[str] = set()
    if (kind := _stores_call(stmt)) is not None:
        return SourceLine(file, stmt.lineno, kind)
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        for t in targets:
            names |= bound_names(t)
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return None
    if not names:
        return None
    loop = _loop_of(tree, line)
    scope: list[ast.stmt] = getattr(loop, "body", body) if loop is not None else body
    # First the statement that keeps the value itself (``segments.append(out)``, ``preds.append(
    # out.logits)``), passing over those that keep something computed from it (``words.append(
    # align(out))``, ``losses.append(out.loss.item())``); only when none does, the first of those.
    for used in (_refers, _uses):
        kept = set(names)
        after = False
        for later in flatten(scope):
            if later is stmt:
                after = True
                continue
            if not after or later.lineno <= stmt.lineno:
                continue
            kind = store_kind(later, kept, used)
            if kind is not None:
                return SourceLine(file, later.lineno, kind)
            if isinstance(later, ast.Assign) and used(later.value, kept):  # texts = out.sequences
                for t in later.targets:
                    if isinstance(t, ast.Name):
                        kept.add(t.id)
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


def flatten(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for stmt in body:
        out.append(stmt)
        for name in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, name, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                out.extend(flatten(inner))
    return out


def call_lines(file: str, function: str) -> list[SourceLine]:
    """The lines in ``file`` that call ``function`` (by its last name: ``load``, ``obj.load``), in
    source order: where a helper that allocated (a loader the script calls) is asked to."""
    tree = tree_of(file)
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
    tree = tree_of(file)
    if tree is None:
        return None
    for _ in range(depth):
        found = enclosing_body(tree, line)
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


def holding_line(
    file: str, line: int, function: str, scripts: list[str], depth: int = 4, outside_forward: bool = False
) -> SourceLine | None:
    """The line of the user's script that asked for the value made at ``file:line`` (in
    ``function``) and keeps it: up through helpers (a ``return helper(...)``, a function of another
    file of the user's folder such as a frame decoder) to the script's calling statement, then that
    statement's keeper (``frames.append(...)``) or the statement itself (``frames = [decode(i) for
    i in ...]``). ``outside_forward``: the value was made outside every module call, so a call from
    a module's ``forward`` did not ask for it."""
    reached: SourceLine | None = None  # the last statement of a script passed on the way up
    for _ in range(depth):
        tree = tree_of(file) if file in scripts else None
        found = enclosing_body(tree, line) if tree is not None else None
        if tree is not None and found is not None:
            if not _returned(tree, found[1]):
                return keeper_line(file, line) or SourceLine(file, found[1].lineno, "keeps")
            if not isinstance(found[1], ast.Return):
                reached = SourceLine(file, found[1].lineno, "keeps")
        if tree is not None:
            function = _function_of(tree, line) or ""
        calls = [c for script in scripts for c in call_lines(script, function) if (c.file, c.line) != (file, line)]
        if outside_forward:
            calls = [c for c in calls if _function_of(tree_of(c.file) or ast.Module([], []), c.line) != "forward"]
        if not calls:
            return reached
        file, line = calls[0].file, calls[0].line
    return reached


def _returned(tree: ast.Module, stmt: ast.stmt) -> bool:
    """Whether ``stmt`` hands its value to the caller: a ``return`` or ``yield``, or an assignment inside a
    function whose ``return`` uses what it binds (``frames = [...]`` then ``return np.stack(frames)``):
    the caller's statement asked for it."""
    if isinstance(stmt, ast.Return):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, (ast.Yield, ast.YieldFrom)):
        return True  # a generator hands each value to the loop that iterates it
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        return False
    names = set().union(*(bound_names(t) for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])))
    fn = function_node(tree, stmt.lineno)
    if fn is None or not names:
        return False
    return any(
        isinstance(n, ast.Return) and n.value is not None and _refers(n.value, names, items=False) for n in ast.walk(fn)
    )


def _function_of(tree: ast.Module, line: int) -> str | None:
    fn = function_node(tree, line)
    return fn.name if fn is not None else None


def statement_at(tree: ast.Module, line: int) -> ast.stmt | None:
    found = enclosing_body(tree, line)
    return found[1] if found is not None else None


def function_node(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    best: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.lineno <= line <= (node.end_lineno or node.lineno) and (best is None or node.lineno > best.lineno):
                best = node
    return best


def callable_name(tree: ast.Module, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """How callers name ``fn``: its name, or its class's for ``__init__`` (``Pipeline(...)``)."""
    if fn.name != "__init__":
        return fn.name
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and fn in node.body:
            return node.name
    return fn.name


def entry_files(files: list[str], script: str | None = None) -> list[str]:
    """The scripts the user ran among ``files`` (the user's files a trace names): ``script`` (a
    trace's ``metadata["script"]``) when it is one of them, else those no other of them imports (a
    helper module such as ``_common.py`` or ``utils.py`` is imported by the script)."""
    if script:
        mine = [f for f in files if os.path.basename(f) == os.path.basename(script)]
        if mine:
            return mine
    imported: set[str] = set()
    for f in files:
        tree = tree_of(f)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[-1] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module.split(".")[-1])
                imported |= {a.name for a in node.names}
    return [f for f in files if os.path.splitext(os.path.basename(f))[0] not in imported]


def script_line(file: str, line: int, entries: list[str], depth: int = 3, hold: bool = True) -> SourceLine | None:
    """The statement of an entry script (``entry_files``) that leads to ``file:line`` of a helper
    module the script imports: up through the functions holding it (by their names, a class for its
    ``__init__``) to the script's first call of one, then that statement's keeper when it keeps the
    result (``frames.append(load(p))``), else the statement (always the statement with ``hold``
    False: the call's arguments are what the fix changes). None when ``file`` is an entry already
    or no call is found."""
    if file in entries or not entries:
        return None
    for _ in range(depth):
        tree = tree_of(file)
        fn = function_node(tree, line) if tree is not None else None
        if tree is None or fn is None:
            return None
        name = callable_name(tree, fn)
        calls = [c for e in entries for c in call_lines(e, name)]
        if calls:
            hit = calls[0]  # then up through the script's own `return helper(...)` to what keeps it
            held = holding_line(hit.file, hit.line, name, entries) if hold else None
            return held or SourceLine(hit.file, hit.line, f"calls {name}")
        inner = [c for c in call_lines(file, name) if c.line != line]
        if not inner:
            return None
        line = inner[0].line
    return None


def handler_line(file: str, line: int) -> SourceLine | None:
    """The ``def`` of the function that calls a model at ``file:line`` once per request (a handler,
    an ``embed_batch`` method: it holds no loop around the call), where ``@torch.no_grad()`` goes;
    None when the call sits in a loop of its own function or at module level (the call's line is
    where ``with torch.no_grad():`` goes)."""
    tree = tree_of(file)
    fn = function_node(tree, line) if tree is not None else None
    if fn is None:
        return None
    for node in ast.walk(fn):
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor, ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            if node.lineno <= line <= (node.end_lineno or node.lineno):
                return None
    return SourceLine(file, fn.lineno, f"def {fn.name}")
