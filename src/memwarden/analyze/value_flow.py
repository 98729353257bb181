"""Where a value goes after the statement that made it: into a function of the user's that keeps it.

``source_lines.keeper_line`` finds the statement of the same loop that keeps a value (``frames.
append(frame)``). A script often hands the value on instead: ``stream.on_frame(i, frame)``, and the
method stores its parameter (``self.history.append({"pixels": pixels, ...})``). The line to change
is that store, one call down. Followed one level, by name: the callee is a function or method of
the same file whose name the call uses, its parameter the one at the argument's position (``self``
skipped for a method) or keyword.
"""

from __future__ import annotations

import ast

from memwarden.analyze.source_lines import SourceLine, bound_names, enclosing_body, flatten, store_kind, tree_of

__all__ = ["passed_keeper"]


def passed_keeper(file: str, line: int) -> SourceLine | None:
    """The statement of a function in ``file`` that keeps the value made at ``file:line``, when a
    later statement of the same body passes it to that function; None when none does."""
    tree = tree_of(file)
    found = enclosing_body(tree, line) if tree is not None else None
    if tree is None or found is None:
        return None
    body, stmt = found
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        return None
    names: set[str] = set()
    for t in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
        names |= bound_names(t)
    functions = {f.name: f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for later in flatten(body):
        if later.lineno <= stmt.lineno:
            continue
        for call in (n for n in ast.walk(later) if isinstance(n, ast.Call)):
            f = call.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            callee = functions.get(name or "")
            param = _parameter(callee, call, names, method=isinstance(f, ast.Attribute)) if callee else None
            if callee is None or param is None:
                continue
            for inner in flatten(callee.body):
                kind = store_kind(inner, {param})
                if kind is not None:
                    return SourceLine(file, inner.lineno, kind)
    return None


def _parameter(fn: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call, names: set[str], method: bool) -> str | None:
    """The parameter of ``fn`` that receives one of ``names`` in ``call``, or None."""
    params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
    if method and params and params[0] in ("self", "cls"):
        params = params[1:]
    for i, arg in enumerate(call.args):
        if isinstance(arg, ast.Name) and arg.id in names and i < len(params):
            return params[i]
    for kw in call.keywords:
        if kw.arg is not None and isinstance(kw.value, ast.Name) and kw.value.id in names:
            return kw.arg
    return None
