"""Where a value the script passes was chosen: a keyword followed back to the user's choice.

The size of a request is often set far from the call that allocates: ``generate(...,
num_return_sequences=per_call)`` in a helper whose caller set ``per_call = N_SAMPLES``; a processor
step reading ``max_pixels=self.max_pixels`` that the script set with ``PageReader(model,
max_pixels=None)``; a ``past_key_values=cache`` whose ``cache = DynamicCache(...)`` is made anew each
turn. These functions read the script's source (``source_lines``: parsed as data, never executed)
and follow such a value through assignments, ``self`` attributes and function parameters to the
statement where the user chose it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from memwarden.analyze.source_lines import (
    SourceLine,
    bound_names,
    call_lines,
    callable_name,
    flatten,
    function_node,
    statement_at,
    tree_of,
)

__all__ = ["Knob", "argument_line", "origin_line", "size_line", "unpacked_line", "tiling_knob"]


def argument_line(file: str, line: int, keywords: tuple[str, ...]) -> SourceLine | None:
    """The line in ``file`` that passes one of ``keywords`` (``num_beams=``, ``padding=``,
    ``max_pixels=``...) to a call, nearest at or before ``line`` in the same function, else anywhere
    in the file: where the size of a request is chosen."""
    tree = tree_of(file)
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


def _assignment(scope: ast.AST, name: str, before: int) -> ast.stmt | None:
    """The last statement of ``scope`` (not inside a nested function) before line ``before`` that
    binds ``name``."""
    best: ast.stmt | None = None
    stack: list[ast.AST] = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.lineno < before:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(name in bound_names(t) for t in targets) and (best is None or node.lineno > best.lineno):
                best = node
        stack.extend(ast.iter_child_nodes(node))
    return best


def origin_line(file: str, line: int, keywords: tuple[str, ...], depth: int = 4) -> SourceLine | None:
    """Where the value a call at ``file:line`` passes as one of ``keywords`` was chosen: the call's
    keyword itself when its value is a literal; else the assignment that bound the name it passes
    (``cache = DynamicCache(...)``, ``per_call = N_SAMPLES``), followed through the function's
    parameters to the argument its caller passed, ``depth`` levels; a module-level constant's own line
    when the call names one directly at module level, and an entry's line when a function reads one
    of a module-level config mapping (``CFG["min_pixels"]``). None when no call at the line passes one of ``keywords``, or
    when each one it passes is a parameter its caller left at the default."""
    tree = tree_of(file)
    stmt = statement_at(tree, line) if tree is not None else None
    if tree is None or stmt is None:
        return None
    values = [
        k.value for node in ast.walk(stmt) if isinstance(node, ast.Call) for k in node.keywords if k.arg in keywords
    ]
    # the first keyword whose value the user chose (one left at a parameter's default was not chosen)
    return next((found for v in values if (found := _follow(tree, file, stmt, v, depth)) is not None), None)


def unpacked_line(file: str, line: int, depth: int = 4) -> SourceLine | None:
    """Where the inputs a call at ``file:line`` unpacks (``model(**inputs)``, ``model(**batch,
    ...)``) were built: the assignment of the name it unpacks, followed through the function's
    parameters to the argument its caller passed (``batch = {k: torch.cat(...)}`` two calls up).
    None when the call unpacks no mapping or its origin is not in the file."""
    tree = tree_of(file)
    stmt = statement_at(tree, line) if tree is not None else None
    if tree is None or stmt is None:
        return None
    values = [k.value for node in ast.walk(stmt) if isinstance(node, ast.Call) for k in node.keywords if k.arg is None]
    return next((found for v in values if (found := _follow(tree, file, stmt, v, depth)) is not None), None)


def size_line(file: str, line: int) -> SourceLine | None:
    """Where the size a statement at ``file:line`` makes a tensor of was chosen: the assignment of a
    name its call's size arguments read (``torch.full((len(rows), target_len), PAD)`` after
    ``target_len = CONFIG["max_length"]``), followed like ``origin_line``'s values. None when the
    sizes are literals or computed from the data (``len(rows)``, ``max(lengths)``)."""
    tree = tree_of(file)
    stmt = statement_at(tree, line) if tree is not None else None
    if tree is None or stmt is None:
        return None
    for node in ast.walk(stmt):
        if not isinstance(node, ast.Call):
            continue
        for arg in [*node.args[:2], *(k.value for k in node.keywords if k.arg in ("size", "shape", "max_length"))]:
            names = (
                [arg] if isinstance(arg, ast.Name) else [e for e in getattr(arg, "elts", []) if isinstance(e, ast.Name)]
            )
            for name in names:
                found = _follow(tree, file, stmt, name, 4)
                if found is not None and found.line != stmt.lineno:
                    return found
    return None


def _follow(tree: ast.Module, file: str, stmt: ast.stmt, value: ast.expr, depth: int) -> SourceLine | None:
    at = SourceLine(file, getattr(value, "lineno", stmt.lineno), "passes it")
    for _ in range(depth):
        if (attr := _self_attribute(value)) is not None:  # self.max_pixels: set in the class's __init__
            bound_attr = _attribute_assignment(tree, at.line, attr)
            if bound_attr is None:
                return at
            value, at = bound_attr.value, SourceLine(file, bound_attr.lineno, f"sets self.{attr}")
            continue
        names = [n.id for n in ast.walk(value) if isinstance(n, ast.Name)]
        if not names:
            return at
        fn = function_node(tree, at.line)
        bound = _assignment(fn if fn is not None else tree, names[0], at.line)
        if bound is not None:
            return SourceLine(file, bound.lineno, f"sets {names[0]}")
        params = [a.arg for a in (fn.args.posonlyargs + fn.args.args)] if fn is not None else []
        if fn is None or names[0] not in params:
            top = _assignment(tree, names[0], 1 << 30)
            if top is not None and fn is None:  # the call names a module-level constant: set there
                return SourceLine(file, top.lineno, f"sets {names[0]}")
            # an entry of a module-level config mapping (``EVAL_CFG["min_pixels"]``): chosen at the
            # entry; a bare constant a function passes (``num_beams=N_BEAMS``) is chosen at the call
            entry = _config_entry(top, value) if top is not None else None
            return SourceLine(file, entry, f"sets {names[0]}") if entry is not None else at
        index = params.index(names[0]) - (1 if params and params[0] in ("self", "cls") else 0)
        calls = [c for c in call_lines(file, callable_name(tree, fn)) if c.line != at.line]
        if not calls:
            return at
        arg = _argument_at(tree, calls[0].line, callable_name(tree, fn), names[0], index)
        if arg is None:
            return None  # the caller left it at its default: not where the user chose anything
        value, at = arg, SourceLine(file, getattr(arg, "lineno", calls[0].line), "passes it")
    return at


def _config_entry(bound: ast.stmt, value: ast.expr) -> int | None:
    """The line of the entry ``value`` reads (``CFG["min_pixels"]``) in the dict literal ``bound``
    assigns (``CFG = {"min_pixels": ...}``), or None when ``value`` is no such read."""
    if not (isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant)):
        return None
    mapping = getattr(bound, "value", None)
    if not isinstance(mapping, ast.Dict):
        return None
    for key, item in zip(mapping.keys, mapping.values, strict=True):
        if isinstance(key, ast.Constant) and key.value == value.slice.value:
            return int(item.lineno)
    return None


def _self_attribute(value: ast.AST) -> str | None:
    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "self":
        return value.attr
    return None


def _attribute_assignment(tree: ast.Module, line: int, attr: str) -> ast.Assign | None:
    """``self.<attr> = ...`` in the class holding ``line`` (its first such statement)."""
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and cls.lineno <= line <= (cls.end_lineno or cls.lineno):
            for node in ast.walk(cls):
                if isinstance(node, ast.Assign) and any(_self_attribute(t) == attr for t in node.targets):
                    return node
    return None


def _argument_at(tree: ast.Module, line: int, function: str, param: str, index: int) -> ast.expr | None:
    """What the call of ``function`` starting at ``line`` passes for parameter ``param`` (keyword,
    else position ``index``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.lineno == line:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name != function:
                continue
            for k in node.keywords:
                if k.arg == param:
                    return k.value
            if 0 <= index < len(node.args) and not isinstance(node.args[index], ast.Starred):
                return node.args[index]
    return None


@dataclass(frozen=True)
class Knob:
    line: int
    name: str
    value: int | bool | None  # None: a name the source does not resolve to a constant


def tiling_knob(file: str, line: int, keywords: tuple[str, ...]) -> Knob | None:
    """A keyword of ``keywords`` passed by a call the statement at ``file:line`` makes once per item
    (``[load_image(f, max_num=12) for f in frames]``, or the statement inside a loop): a setting that
    multiplies with the items. A literal or a module-level ``NAME = 12`` must be above 1 (or True);
    any other value (a parameter, an expression) is returned with ``value`` None, for the trace to
    judge."""
    tree = tree_of(file)
    stmt = statement_at(tree, line) if tree is not None else None
    if tree is None or stmt is None:
        return None
    scopes: list[ast.AST] = []
    # the statement, then the ones in its function that fed the names it reads (``pix.append(tiles)``
    # in the loop above ``torch.cat(pix)``, and ``tiles = load(frame, max_num=12)`` before it)
    for fed in [stmt, *_feeders(tree, stmt)]:
        comps = [n for n in ast.walk(fed) if isinstance(n, (ast.ListComp, ast.GeneratorExp, ast.SetComp))]
        scopes += [fed] if _in_loop(tree, fed) else comps  # once per item, or not at all
    for scope in scopes:
        for node in ast.walk(scope):
            if not isinstance(node, ast.Call):
                continue
            for k in node.keywords:
                if k.arg in keywords:
                    value = _constant(tree, k.value)
                    if value is None or value is True or (not isinstance(value, bool) and value > 1):
                        return Knob(getattr(k.value, "lineno", node.lineno), str(k.arg), value)
    return None


def _feeders(tree: ast.Module, stmt: ast.stmt, hops: int = 2) -> list[ast.stmt]:
    """Statements of ``stmt``'s function, before it, that bind or append to a name it reads, and
    (``hops`` deep) those that bind the names they read."""
    fn = function_node(tree, stmt.lineno)
    if fn is None:
        return []
    body = [
        s for s in flatten(fn.body) if isinstance(s, (ast.Assign, ast.AugAssign, ast.Expr)) and s.lineno < stmt.lineno
    ]
    names = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    found: list[ast.stmt] = []
    for _ in range(hops):
        fed = [s for s in body if s not in found and names & _bound_or_appended(s)]
        found += fed
        names = {n.id for s in fed for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return found


def _bound_or_appended(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, ast.Assign):
        return {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        return {stmt.target.id}
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in ("append", "extend"):
        owner = call.func.value
        return {owner.id} if isinstance(owner, ast.Name) else set()
    return set()


def _in_loop(tree: ast.Module, stmt: ast.stmt) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While)) and node is not stmt:
            if node.lineno < stmt.lineno <= (node.end_lineno or node.lineno):
                return True
    return False


def _constant(tree: ast.Module, node: ast.AST) -> int | bool | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, bool)):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):  # 4 * TILE
        left, right = _constant(tree, node.left), _constant(tree, node.right)
        if isinstance(left, int) and isinstance(right, int) and not isinstance(left, bool):
            return left * right
    if isinstance(node, ast.Name):
        for top in tree.body:
            if isinstance(top, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in top.targets):
                return _constant(tree, top.value) if isinstance(top.value, ast.Constant) else None
    return None
