"""An ONNX graph as the capture needs it: nodes, who consumes what, initializer bytes, module paths.

Torch-free and ORT-free: it reads the ``onnx`` protobuf only. ONNX files are untrusted input:
loading one parses a protobuf and nothing in it is executed; a file that is not a model raises
``InputError`` with one line.

Module paths come from node names. The TorchScript exporter names a node after the module
scope it ran in (``/model/language_model/layers.0/self_attn/q_proj/MatMul``) and ORT keeps that
prefix on the nodes it fuses (``.../input_layernorm/Mul_1/SimplifiedLayerNormFusion/``), so the
path is the leading components up to the first one that looks like an op name. memwarden's own
export also stores ``memwarden.module_prefix`` in the model's metadata (the part of the path the
wrapper module hid, ``model.``) and ``memwarden.module_roots`` (top-level modules it does not
apply to), so paths match the PyTorch capture of the same model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memwarden.errors import InputError
from memwarden.units import DTYPE_BYTES as ELEMENT_BYTES
from memwarden.units import ONNX_DTYPES
from memwarden.untrusted import terminal_safe

__all__ = ["DTYPE_BYTES", "GraphInfo", "NodeInfo", "load_graph", "module_path_of"]

# Element size per ONNX / ORT type name, as the ORT profile writes them (``float``, ``int64``)
# and as TensorProto names them (``FLOAT``, ``INT64``), lower-cased.
DTYPE_BYTES: dict[str, int] = {name: ELEMENT_BYTES[name] for name in ONNX_DTYPES}  # sizes: memwarden.units

_OP_COMPONENT = re.compile(r"^[A-Z]")  # op names are CamelCase (MatMul_1, Reshape_new_reshape); module names are not


def module_path_of(node_name: str, prefix: str = "", roots: frozenset[str] = frozenset()) -> str | None:
    """``/model/vision_tower/encoder/layers.0/mlp/fc1/MatMul`` -> ``model.vision_tower.encoder.layers.0.mlp.fc1``."""
    if "/" not in node_name:
        return None
    parts = []
    for component in node_name.split("/"):
        if not component:
            continue
        if _OP_COMPONENT.match(component):
            break
        parts.append(component)
    if not parts:
        return None
    path = ".".join(parts)
    return path if parts[0] in roots else prefix + path


@dataclass(frozen=True)
class NodeInfo:
    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    module: str | None


@dataclass
class GraphInfo:
    """The nodes in file order, initializer sizes and the graph's inputs/outputs."""

    nodes: list[NodeInfo]
    initializer_bytes: dict[str, int]
    inputs: list[str]
    outputs: list[str]
    metadata: dict[str, str] = field(default_factory=dict)
    static_values: frozenset[str] = frozenset()  # values whose shape the graph states in full (ORT can plan reuse)
    # value -> (element type, dims as ONNX infers them before the run: an int, or a symbol name).
    # ORT's planner lets a value reuse a dead one's buffer only when these are equal (its
    # ``SameSize``: same element size, same rank, each dim the same number or the same symbol), so
    # two values of a dynamic-axes export with equal bytes at run time often do not share one.
    planned_shapes: dict[str, tuple[int, tuple[int | str, ...]]] = field(default_factory=dict)
    unbounded: list[str] = field(default_factory=list)  # control-flow nodes without a bound (``guard``)
    # input -> (ONNX element type, 0 where the file gives none; dims: an int, a symbol name or None
    # for a free axis; None where the rank is unknown): what feeds are checked against before any
    # of their data is read (``feeds.check_feed_shapes``)
    input_specs: dict[str, tuple[int, tuple[int | str | None, ...] | None]] = field(default_factory=dict)

    def consumers(self) -> dict[str, list[str]]:
        """Value name -> names of the nodes that read it (subgraph reads are not followed)."""
        out: dict[str, list[str]] = {}
        for node in self.nodes:
            for value in node.inputs:
                if value:
                    out.setdefault(value, []).append(node.name)
        return out

    def producer_module(self) -> dict[str, str | None]:
        """Initializer name -> module path of its first consumer (where a weight belongs)."""
        owner: dict[str, str | None] = {}
        for node in self.nodes:
            for value in node.inputs:
                if value in self.initializer_bytes and value not in owner:
                    owner[value] = node.module
        return owner


def _tensor_bytes(tensor: object) -> int:
    from onnx import helper

    dims = [int(d) for d in tensor.dims]  # type: ignore[attr-defined]
    count = 1
    for d in dims:
        count *= d
    name = helper.tensor_dtype_to_np_dtype(tensor.data_type)  # type: ignore[attr-defined]
    return count * int(name.itemsize)


def load_graph(source: str | Path | bytes, *, external_folder: Path | None = None) -> GraphInfo:
    """Parse an ONNX model (path or bytes) into a ``GraphInfo``; external data is not read, only
    checked to exist in ``external_folder`` (default: the model's folder) with the declared size."""
    import onnx
    from google.protobuf.message import DecodeError

    from memwarden.record.onnx.guard import check_model, load_checked

    if isinstance(source, bytes):
        try:
            model = onnx.load_from_string(source)
        except (DecodeError, ValueError, RuntimeError, TypeError) as exc:
            raise InputError(f"model bytes: not an ONNX model ({terminal_safe(exc)[:200]})") from None
        checked = check_model(model, None, label="model bytes")
    else:
        model, checked = load_checked(source, external_folder=external_folder)
    graph = model.graph
    if not graph.node:
        raise InputError("the ONNX model has no nodes")
    metadata = {p.key: p.value for p in model.metadata_props}
    prefix = metadata.get("memwarden.module_prefix", "")
    roots = frozenset(r for r in metadata.get("memwarden.module_roots", "").split(",") if r)
    nodes = [
        NodeInfo(
            name=n.name or f"{n.op_type}_{i}",
            op_type=n.op_type,
            inputs=tuple(n.input),
            outputs=tuple(n.output),
            module=module_path_of(n.name, prefix, roots),
        )
        for i, n in enumerate(graph.node)
    ]
    initializer_bytes = {t.name: _tensor_bytes(t) for t in graph.initializer}
    static = frozenset(
        v.name
        for v in (*graph.value_info, *graph.input, *graph.output)
        if v.type.HasField("tensor_type")
        and v.type.tensor_type.HasField("shape")
        and all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)
    )
    initializer_names = set(initializer_bytes)
    return GraphInfo(
        planned_shapes=_planned_shapes(model),
        nodes=nodes,
        initializer_bytes=initializer_bytes,
        inputs=[i.name for i in graph.input if i.name not in initializer_names],
        outputs=[o.name for o in graph.output],
        metadata=metadata,
        static_values=static,
        unbounded=list(checked.unbounded),
        input_specs={i.name: _input_spec(i) for i in graph.input if i.name not in initializer_names},
    )


def _input_spec(value: Any) -> tuple[int, tuple[int | str | None, ...] | None]:
    if not value.type.HasField("tensor_type"):
        return 0, None  # a sequence or map input: ORT checks it
    t = value.type.tensor_type
    if not t.HasField("shape"):
        return int(t.elem_type), None
    dims = tuple(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
    return int(t.elem_type), dims


def _planned_shapes(model: Any) -> dict[str, tuple[int, tuple[int | str, ...]]]:
    """Every value's shape as a planner sees it before the run (see ``GraphInfo.planned_shapes``):
    ONNX's inference without data propagation, so a dim computed from ``Shape`` (a dynamic-axes
    Reshape) gets a symbol of its own. That errs towards no reuse, which ORT's counters correct
    (``planner_hold``); with data propagation ViT's MLP buffers were kept for a reuse ORT never
    made (+33% against a malloc count). A value without a full shape is left out (no reuse)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - inference is best effort here: without it no reuse is predicted
        inferred = model.graph
    out: dict[str, tuple[int, tuple[int | str, ...]]] = {}
    for v in (*inferred.value_info, *inferred.input, *inferred.output):
        t = v.type.tensor_type
        if not t.HasField("shape") or not t.shape.dim:
            continue  # unknown rank, or a scalar (ORT never reuses for those)
        dims: list[int | str] = []
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.dim_param:
                dims.append(d.dim_param)
            else:
                break
        else:
            out[v.name] = (int(t.elem_type), tuple(dims))
    return out
