"""Memoised meta kernels: an op seen before with the same operand metadata gets fresh outputs of the
same shapes without running its meta kernel again.

Why: most aten meta kernels are PyTorch's Python references (``torch._refs``/``torch._prims``),
so one ``mul`` on meta costs about a millisecond, and a 7B decoder repeats the same few dozen
ops with the same shapes in every layer and every decode step. A meta kernel's outputs depend
only on the operands' metadata (shape, stride, storage offset, dtype, device) and the non-tensor
arguments, so the first call's output metadata answers every later call with the same key.

Exactness: an op whose schema mutates nothing and returns no alias is memoised only if its
outputs are plain dense tensors, none sharing a storage with an input or another output, that
``empty_strided`` rebuilds with the same storage size; an in-place op that writes only its first
argument is memoised only if its first call returned that argument with its layout unchanged
(a hit returns the argument, as the kernel would). Views and other aliasing ops are cheap C++
kernels and always run. Any other case is marked as one to run every time. The capture records storages, not
kernels, so a rebuilt output is recorded exactly as the kernel's own would have been.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["MetaMemo", "key_of"]

_TENSOR = torch._C.TensorBase
_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format})
_META = torch.device("meta")
_UNCACHEABLE = object()  # an entry for a key whose outputs cannot be rebuilt
_INPLACE_ENTRY = object()  # an in-place op that leaves its first argument's layout as it was


class _NotKeyable(Exception):
    """An argument the key cannot describe (a generator, a symbolic size, an opaque object)."""


def key_of(values: Any, out: list[Any]) -> bool:
    """Append a hashable description of ``values`` (aten arguments) to ``out``; False if one cannot be."""
    try:
        _key_of(values, out)
    except _NotKeyable:
        return False
    return True


def _key_of(values: Any, out: list[Any]) -> None:
    # Type goes in with the value: 1, 1.0 and True hash alike but promote to different dtypes.
    for v in values:
        cls = type(v)
        if cls in _SCALARS:
            out.append(cls)
            out.append(v)
        elif isinstance(v, _TENSOR):
            out.append((v.shape, v.stride(), v.storage_offset(), v.dtype, v.device, v.is_conj(), v.is_neg()))
        elif cls is list or cls is tuple:
            out.append(len(v))
            _key_of(v, out)
        else:
            raise _NotKeyable


_PURE, _INPLACE = 1, 2


def _op_kind(func: Any) -> int:
    """_PURE (mutates nothing, returns new tensors), _INPLACE (writes its first argument only and
    returns it: ``mul_``, ``normal_``), or 0 (views, ``out=`` variants, anything else)."""
    schema = func._schema
    if not schema.is_mutable:
        return _PURE if all(r.alias_info is None for r in schema.returns) else 0
    arguments, returns = schema.arguments, schema.returns
    writes = [i for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write]
    if writes == [0] and len(returns) == 1 and returns[0].alias_info is not None:
        return _INPLACE
    return 0


class MetaMemo:
    """``run(func, args, kwargs)``: ``func`` on meta operands, answered from earlier calls where it can be."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], Any] = {}
        self._ops: dict[int, tuple[Any, int]] = {}  # id(op) -> (op, kind): ids hash in C, ops in Python
        self.hits = 0
        self.misses = 0

    def run(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        found = self._ops.get(id(func))
        if found is None:
            found = self._ops[id(func)] = (func, _op_kind(func))
        kind = found[1]
        if not kind:
            return func(*args, **kwargs)
        parts: list[Any] = [id(func)]
        try:
            _key_of(args, parts)
            parts.append(tuple(kwargs))
            _key_of(kwargs.values(), parts)
        except _NotKeyable:
            return func(*args, **kwargs)
        key = tuple(parts)
        entry = self._entries.get(key)
        if entry is not None:
            if entry is _UNCACHEABLE:
                return func(*args, **kwargs)
            self.hits += 1
            return args[0] if entry is _INPLACE_ENTRY else _rebuild(entry)
        self.misses += 1
        if kind == _INPLACE:
            self_ = args[0] if args else None
            before = _layout(self_)
            out = func(*args, **kwargs)
            # the meta kernel only checked the operands: an op that resized or restrided ``self``
            # (``resize_``, ``squeeze_``) runs every time
            same = before is not None and out is self_ and _layout(self_) == before
            self._entries[key] = _INPLACE_ENTRY if same else _UNCACHEABLE
            return out
        out = func(*args, **kwargs)
        self._entries[key] = _template(out, args, kwargs)
        return out


def _layout(t: Any) -> tuple[Any, ...] | None:
    if not isinstance(t, _TENSOR) or not t.is_meta:
        return None
    return (t.shape, t.stride(), t.storage_offset(), t.dtype, t.untyped_storage().nbytes())


def _rebuild(template: Any) -> Any:
    if type(template) is tuple and template and template[0] is _Spec:
        _, shape, stride, dtype = template
        return torch.empty_strided(shape, stride, dtype=dtype, device=_META)
    if type(template) is list:
        return [_rebuild(t) for t in template]
    return tuple(_rebuild(t) for t in template[1:])  # ("tuple", ...)


class _Spec:
    """Marks a tensor template: (_Spec, shape, stride, dtype)."""


def _template(out: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What rebuilds ``out``; _UNCACHEABLE unless every output is a fresh dense meta tensor that
    ``empty_strided`` rebuilds with the same storage."""
    inputs: set[int] = set()
    stack: list[Any] = [args, list(kwargs.values())]
    while stack:
        v = stack.pop()
        if isinstance(v, _TENSOR):
            inputs.add(v.untyped_storage()._cdata)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)

    outputs: set[int] = set()

    def spec(t: Any) -> Any:
        if isinstance(t, list):
            return [spec(x) for x in t]
        if isinstance(t, tuple):
            return ("tuple", *(spec(x) for x in t))
        if type(t) is not torch.Tensor or not t.is_meta or t.layout != torch.strided or t.is_conj() or t.is_neg():
            raise _NotKeyable
        st = t.untyped_storage()
        if st._cdata in inputs or st._cdata in outputs or t.storage_offset() != 0:
            raise _NotKeyable
        outputs.add(st._cdata)
        shape, stride = tuple(t.shape), tuple(t.stride())
        if torch.empty_strided(shape, stride, dtype=t.dtype, device=_META).untyped_storage().nbytes() != st.nbytes():
            raise _NotKeyable
        return (_Spec, shape, stride, t.dtype)

    try:
        return spec(out)
    except _NotKeyable:
        return _UNCACHEABLE
