"""Concrete shapes for an ONNX graph before it is costed: the partitioner needs bytes and operation
counts, and a graph exported with dynamic axes (``batch``, ``sequence``: the usual
``torch.onnx.export(..., dynamic_axes=...)``) has none past its inputs.

Every symbolic input dimension is bound, in this order, from the feeds' shapes (``--inputs``), a
named binding (``--dim batch=4``), else 1 (reported as assumed, so the caller can say so). Then
shapes are inferred through the graph: ONNX Runtime's symbolic shape inference where it can run
(it needs sympy, ORT's ``symbolic`` extra, and follows ``Shape -> Gather -> Range -> Expand``
chains of attention masks and padding that ONNX's own inference leaves unknown), else ONNX's
``infer_shapes(data_prop=True)``. Values whose shape is still unknown cost nothing; their count
is returned so the result can say how much of the graph is unsized.

External data: only small initializers (shape constants, which inference reads) are loaded, from
the model's own folder; large ones keep their dims and type, which is all the costing needs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memwarden.errors import InputError
from memwarden.untrusted import terminal_safe

__all__ = ["ShapedGraph", "load_shaped"]

_SMALL_INITIALIZER_ELEMENTS = 4096  # shape constants and index tables; weights are far larger


@dataclass(frozen=True, kw_only=True)
class ShapedGraph:
    """An ONNX model whose value_info holds the inferred shapes, and how its inputs were bound."""

    model: Any  # onnx.ModelProto
    dims: Mapping[str, int]  # symbolic input dimension -> the value it was bound to
    assumed_dims: tuple[str, ...]  # the ones bound to 1 for want of a binding
    inference: str  # "onnxruntime-symbolic" or "onnx"
    unsized_values: int  # node outputs whose shape is still unknown (costed as 0 bytes)


def load_shaped(
    path: str | Path,
    *,
    dims: Mapping[str, int] | None = None,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> ShapedGraph:
    """Read ``path``, bind its symbolic input dimensions and infer every value's shape."""
    import onnx
    from google.protobuf.message import DecodeError

    p = Path(path)
    if not p.is_file():
        raise InputError(terminal_safe(f"{path}: no such ONNX file"))
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise InputError(terminal_safe(f"{path}: not a readable ONNX model ({_first_line(exc)})")) from None
    if not model.graph.node:
        raise InputError(terminal_safe(f"{path}: the ONNX graph has no nodes"))
    _detach_external_data(model, p)
    bound, assumed = _bind_inputs(model, dict(dims or {}), dict(input_shapes or {}))
    shaped, how = _infer(model, path)
    return ShapedGraph(
        model=shaped, dims=bound, assumed_dims=tuple(assumed), inference=how, unsized_values=_count_unsized(shaped)
    )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return (lines[0] if lines else type(exc).__name__)[:200]


def _detach_external_data(model: Any, path: Path) -> None:
    """Load the small external initializers, drop the reference of the large ones (dims stay)."""
    import math

    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    for tensor in model.graph.initializer:
        if not uses_external_data(tensor):
            continue
        if math.prod(tensor.dims) <= _SMALL_INITIALIZER_ELEMENTS:
            try:
                load_external_data_for_tensor(tensor, str(path.parent))
                continue
            except (OSError, ValueError, onnx.checker.ValidationError) as exc:  # missing, short, outside the folder
                location = next((e.value for e in tensor.external_data if e.key == "location"), "?")
                raise InputError(
                    terminal_safe(
                        f"{path}: cannot read external data {location!r} of initializer {tensor.name!r} "
                        f"(it must sit next to the model): {_first_line(exc)}"
                    )
                ) from None
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


def _bind_inputs(
    model: Any, dims: dict[str, int], input_shapes: dict[str, tuple[int, ...]]
) -> tuple[dict[str, int], list[str]]:
    initializers = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    unknown = sorted(set(input_shapes) - {v.name for v in inputs})
    if unknown:
        raise InputError(
            terminal_safe(
                f"feeds name no model input: {', '.join(unknown[:10])} (inputs: {', '.join(v.name for v in inputs[:20])})"
            )[:600]
        )
    bound: dict[str, int] = {}
    assumed: list[str] = []
    for value in inputs:
        given = input_shapes.get(value.name)
        if not value.type.tensor_type.HasField("shape") and given is not None:  # rank unknown: the feed's
            value.type.tensor_type.shape.SetInParent()
            for _ in given:
                value.type.tensor_type.shape.dim.add()
        shape = value.type.tensor_type.shape
        if given is not None and len(given) != len(shape.dim):
            raise InputError(f"feed {value.name!r} has {len(given)} dimensions; the model wants {len(shape.dim)}")
        for axis, dim in enumerate(shape.dim):
            if dim.HasField("dim_value"):
                if given is not None and int(given[axis]) != dim.dim_value:
                    raise InputError(
                        f"feed {value.name!r} has {given[axis]} on axis {axis}; the model wants {dim.dim_value}"
                    )
                continue
            name = dim.dim_param or f"{value.name}[{axis}]"
            if given is not None:
                size = int(given[axis])
            elif name in dims:
                size = dims[name]
            elif name in bound:
                size = bound[name]
            else:
                size = 1
                assumed.append(name)
            bound.setdefault(name, size)
            dim.Clear()
            dim.dim_value = size
    unused = sorted(set(dims) - set(bound))
    if unused:
        raise InputError(terminal_safe(f"--dim names no symbolic input dimension: {', '.join(unused[:20])}")[:600])
    return bound, assumed


def _infer(model: Any, path: str | Path) -> tuple[Any, str]:
    import onnx

    try:
        return _ort_symbolic(model), "onnxruntime-symbolic"
    except Exception:  # noqa: BLE001 - optional and best effort (sympy absent, an op it cannot follow): use ONNX's
        pass
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True), "onnx"
    except (ValueError, RuntimeError, onnx.shape_inference.InferenceError) as exc:
        raise InputError(terminal_safe(f"{path}: not a readable ONNX model ({_first_line(exc)})")) from None


def _ort_symbolic(model: Any) -> Any:
    """ORT's ``SymbolicShapeInference.infer_shapes`` without its side effect: on an incomplete
    pass it saves the model into the current directory; here the partial result is used."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    log = logging.getLogger("onnxruntime.tools.symbolic_shape_infer")
    level = log.level
    log.setLevel(logging.CRITICAL)  # its per-node warnings are about values the count below reports
    try:
        inference = SymbolicShapeInference(2**31 - 1, True, False, 0)
        inference._preprocess(model)
        while inference.run_:
            inference._infer_impl()
        inference._update_output_from_vi()
        return inference.out_mp_
    finally:
        log.setLevel(level)


def _count_unsized(model: Any) -> int:
    sized = set()
    for v in (*model.graph.value_info, *model.graph.output):
        t = v.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            sized.add(v.name)
    return sum(1 for n in model.graph.node if n.op_type != "Constant" for o in n.output if o and o not in sized)
