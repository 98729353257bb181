"""What autograd saved for backward, read from the graph a model call's outputs hold.

When an outermost module call returns outputs that require grad, the capture walks their
autograd graph (``grad_fn`` and its ``next_functions``) and reads each node's saved tensors
through its ``_raw_saved_*`` attributes without unpacking them. A saved tensor that has unpack
hooks (``torch.utils.checkpoint``, ``save_on_cpu``) is skipped: it is not what the graph keeps
(and unpacking it would recompute or copy). Read-only: nothing is registered on the graph, so
code that refuses saved-tensor hooks (``torch.func.vmap``, transformers' vmapped masks) runs as
without a capture. Saved tensors of ops outside any module call (a loss computed by the
script) are not seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["saved_tensors"]

_RAW = "_raw_saved_"
_NODE_LIMIT = 200_000  # nodes walked per call: a graph chained across many steps is cut off here
_names: dict[type, tuple[str, ...]] = {}
_SavedTensor: Any = getattr(getattr(torch._C, "_autograd", None), "SavedTensor", None)


def _raw_names(node: Any) -> tuple[str, ...]:
    cls = type(node)
    names = _names.get(cls)
    if names is None:
        names = tuple(a for a in dir(node) if a.startswith(_RAW))
        _names[cls] = names
    return names


def _graph_roots(output: Any, depth: int = 0) -> Iterator[Any]:
    """The ``grad_fn`` of each tensor in the output (tensors, tuples, lists, dicts, ModelOutput)."""
    if isinstance(output, torch.Tensor):
        if output.grad_fn is not None:
            yield output.grad_fn
    elif depth < 4 and isinstance(output, (tuple, list)):
        for item in output:
            yield from _graph_roots(item, depth + 1)
    elif depth < 4 and isinstance(output, dict):
        for item in output.values():
            yield from _graph_roots(item, depth + 1)


def _unpacked(raw: Any) -> Iterator[torch.Tensor]:
    for saved in raw if isinstance(raw, (tuple, list)) else (raw,):
        if _SavedTensor is None or not isinstance(saved, _SavedTensor) or saved.unpack_hook is not None:
            continue
        data = saved.data
        if isinstance(data, torch.Tensor):
            yield data


def saved_tensors(output: Any) -> Iterator[torch.Tensor]:
    """Every tensor autograd saved in the graph behind ``output`` (as many times as saved)."""
    stack = list(_graph_roots(output))
    if not stack or _SavedTensor is None:
        return
    seen: set[int] = set()
    walked: list[Any] = []  # held while walking, so no id in ``seen`` is reused by a new node
    while stack and len(walked) < _NODE_LIMIT:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        walked.append(node)
        for name in _raw_names(node):
            try:
                raw = getattr(node, name)
            except RuntimeError:  # released by a backward that ran already
                continue
            yield from _unpacked(raw)
        for nxt, _index in node.next_functions:
            if nxt is not None:
                stack.append(nxt)
