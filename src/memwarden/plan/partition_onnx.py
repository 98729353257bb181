"""An ONNX graph as a ``PartitionProblem`` for a device's compute units.

Per node: its op class and operation count (from ONNX shape inference), its output bytes, the
initializers it is the first to read (its weights), the graph inputs it reads and the graph
outputs it writes. ``Constant`` nodes are folded into weights. The deployment dtype (``dtype``)
is what the nodes are costed and checked in: ``auto`` keeps the graph's own float type; ``fp16``
or ``int8`` model a converted deployment (float tensors shrink accordingly), which is what an
NPU that has no fp32 needs.

Shapes come from ``memwarden.plan.partition_shapes`` (symbolic input dimensions bound first).
ONNX files are untrusted: this reads the protobuf and runs shape inference, nothing else.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.errors import InputError
from memwarden.models.compute_units import ComputeUnitSpec
from memwarden.plan.partition import PartitionProblem
from memwarden.plan.partition_shapes import load_shaped
from memwarden.units import DTYPE_BYTES

__all__ = ["OP_CLASS", "load_problem", "op_class", "problem_of"]

OP_CLASS: dict[str, str] = {
    **dict.fromkeys(
        [
            "MatMul",
            "Gemm",
            "FusedMatMul",
            "MatMulInteger",
            "QLinearMatMul",
            "Attention",
            "MultiHeadAttention",
            "Einsum",
        ],
        "matmul",
    ),
    **dict.fromkeys(["Conv", "ConvTranspose", "QLinearConv", "ConvInteger"], "conv"),
    **dict.fromkeys(
        [
            "Softmax",
            "LogSoftmax",
            "ReduceMean",
            "ReduceSum",
            "ReduceMax",
            "ReduceMin",
            "ReduceProd",
            "ReduceL2",
            "LayerNormalization",
            "SimplifiedLayerNormalization",
            "SkipLayerNormalization",
            "BatchNormalization",
            "InstanceNormalization",
            "GroupNormalization",
            "RMSNormalization",
            "ArgMax",
            "ArgMin",
            "CumSum",
            "TopK",
            "MaxPool",
            "AveragePool",
            "GlobalAveragePool",
        ],
        "reduce",
    ),
    **dict.fromkeys(
        [
            "Reshape",
            "Transpose",
            "Concat",
            "Split",
            "Slice",
            "Gather",
            "GatherElements",
            "GatherND",
            "Expand",
            "Squeeze",
            "Unsqueeze",
            "Flatten",
            "Identity",
            "Shape",
            "Size",
            "ConstantOfShape",
            "Range",
            "Tile",
            "Pad",
            "Resize",
            "ScatterND",
            "ScatterElements",
            "Trilu",
            "NonZero",
        ],
        "data",
    ),
}
_ELEMENTWISE = frozenset(
    [
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Sqrt",
        "Exp",
        "Log",
        "Neg",
        "Abs",
        "Reciprocal",
        "Relu",
        "Sigmoid",
        "Tanh",
        "Gelu",
        "FastGelu",
        "QuickGelu",
        "Erf",
        "Where",
        "Cast",
        "Equal",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "And",
        "Or",
        "Not",
        "Xor",
        "IsNaN",
        "IsInf",
        "Max",
        "Min",
        "Clip",
        "LeakyRelu",
        "HardSigmoid",
        "Softplus",
        "Sin",
        "Cos",
        "Floor",
        "Ceil",
        "Round",
        "Mod",
        "BitShift",
        "Sign",
        "Elu",
        "Selu",
        "PRelu",
        "Mish",
    ]
)
_FLOAT_TYPES = {1: "float32", 10: "float16", 16: "bfloat16", 11: "float64"}  # TensorProto FLOAT, FLOAT16, ...
_FLOAT_BYTES = {code: DTYPE_BYTES[name] for code, name in _FLOAT_TYPES.items()}  # sizes: memwarden.units
_DTYPE_NAME = {1: "fp32", 10: "fp16", 16: "bf16", 11: "fp64", 3: "int8", 2: "int8"}
_DEPLOY_TYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "int8"}  # --dtype's names
_DEPLOY_BYTES = {short: DTYPE_BYTES[name] for short, name in _DEPLOY_TYPES.items()}
_OP_COMPONENT = re.compile(r"^[A-Z]")


def op_class(op_type: str) -> str:
    if op_type in OP_CLASS:
        return OP_CLASS[op_type]
    return "elementwise" if op_type in _ELEMENTWISE else "other"


def _module_of(node_name: str) -> str:
    """``/model/layers.0/mlp/fc1/MatMul`` -> ``model.layers.0.mlp.fc1`` (as the ORT capture reads names)."""
    parts = []
    for component in node_name.split("/"):
        if component and _OP_COMPONENT.match(component):
            break
        if component:
            parts.append(component)
    return ".".join(parts)


def _elements(shape: tuple[int, ...] | None) -> int:
    return int(math.prod(shape)) if shape is not None else 0


def load_problem(
    path: str | Path,
    units: tuple[ComputeUnitSpec, ...],
    *,
    dtype: str = "auto",
    dims: Mapping[str, int] | None = None,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> PartitionProblem:
    """Read ``path``, bind its symbolic input dimensions (``partition_shapes``) and cost every node
    on every unit."""
    return problem_of(load_shaped(path, dims=dims, input_shapes=input_shapes).model, units, dtype=dtype)


def problem_of(model: Any, units: tuple[ComputeUnitSpec, ...], *, dtype: str = "auto") -> PartitionProblem:
    """Cost every node of a shape-inferred ONNX ``model`` on every unit."""
    import onnx

    if dtype != "auto" and dtype not in _DEPLOY_BYTES:
        raise InputError(f"unknown deployment dtype {dtype!r} (valid: auto, {', '.join(_DEPLOY_BYTES)})")
    graph = model.graph
    if not graph.node:
        raise InputError("the ONNX graph has no nodes")
    info: dict[str, tuple[int, tuple[int, ...] | None]] = {}  # value -> (elem type, shape)
    for v in (*graph.value_info, *graph.input, *graph.output):
        t = v.type.tensor_type
        dims = (
            tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim) if t.HasField("shape") else None
        )
        info[v.name] = (t.elem_type, dims if dims is not None and all(d >= 0 for d in dims) else None)
    weights: dict[str, int] = {}
    for init in graph.initializer:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
        weights[init.name] = _elements(tuple(init.dims)) * itemsize
        info[init.name] = (init.data_type, tuple(int(d) for d in init.dims))
    nodes = []
    for node in graph.node:
        if node.op_type == "Constant" and not node.domain:
            for attr in node.attribute:
                if attr.name == "value":
                    weights[node.output[0]] = len(attr.t.raw_data) or 8
                    info[node.output[0]] = (attr.t.data_type, tuple(int(d) for d in attr.t.dims))
            continue
        nodes.append(node)
    return _build(nodes, graph, info, weights, units, dtype)


def _build(
    nodes: list[Any],
    graph: Any,
    info: dict[str, tuple[int, tuple[int, ...] | None]],
    weights: dict[str, int],
    units: tuple[ComputeUnitSpec, ...],
    dtype: str,
) -> PartitionProblem:
    n, nu = len(nodes), len(units)
    float_types = {t for t, s in info.values() if t in _FLOAT_BYTES}
    native = next((_DTYPE_NAME[t] for t in (1, 10, 16, 11) if t in float_types), "fp32")

    def node_dtype(node: Any) -> str:
        """The dtype a node runs in: ``dtype``, or with ``auto`` its own float type (an fp16
        export on CPU mixes fp16 and fp32 nodes; each is costed and checked as it is)."""
        if dtype != "auto":
            return dtype
        elems = (info.get(v, (0, None))[0] for v in (*node.output, *node.input) if v)
        return next((_DTYPE_NAME[e] for e in elems if e in _FLOAT_BYTES), native)

    def nbytes(value: str) -> int:
        elem, shape = info.get(value, (0, None))
        count = _elements(shape)
        if elem in _FLOAT_BYTES:  # auto: the value's own width; else the deployment's
            return count * (_FLOAT_BYTES[elem] if dtype == "auto" else _DEPLOY_BYTES[dtype])
        return count * {7: 8, 6: 4, 9: 1, 2: 1, 3: 1, 5: 2, 4: 2, 12: 4, 13: 8}.get(elem, 4)

    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for out in node.output:
            if out:
                producer[out] = i
    graph_inputs = {v.name for v in graph.input} - set(weights)
    graph_outputs = {v.name for v in graph.output}
    compute = np.zeros((n, nu))
    weight_bytes = np.zeros(n)
    output_bytes = np.zeros(n)
    input_bytes = np.zeros(n)
    result_bytes = np.zeros(n)
    edges: dict[tuple[int, int, int], float] = {}  # (producer, consumer, tensor) -> bytes
    tensor_ids: dict[str, int] = {}
    claimed: set[str] = set()
    for i, node in enumerate(nodes):
        cls = op_class(node.op_type)
        deploy = node_dtype(node)
        outs = [o for o in node.output if o]
        out_elems = sum(_elements(info.get(o, (0, None))[1]) for o in outs)
        output_bytes[i] = sum(nbytes(o) for o in outs)
        result_bytes[i] = sum(nbytes(o) for o in outs if o in graph_outputs)
        ops = float(out_elems)
        if cls == "matmul" and len(node.input) >= 2:
            shape_a = info.get(node.input[0], (0, None))[1]
            ops = 2.0 * out_elems * (shape_a[-1] if shape_a else 1)
        elif cls == "conv" and len(node.input) >= 2:
            w = info.get(node.input[1], (0, None))[1]
            ops = 2.0 * out_elems * (math.prod(w[1:]) if w else 1)
        elif cls == "reduce":
            ops = 4.0 * sum(_elements(info.get(x, (0, None))[1]) for x in node.input[:1] if x)
        for value in node.input:
            if not value:
                continue
            if value in weights:
                if value not in claimed:
                    claimed.add(value)
                    elem = info[value][0]
                    weight_bytes[i] += weights[value] * (
                        _DEPLOY_BYTES[dtype] / _FLOAT_BYTES[elem] if elem in _FLOAT_BYTES and dtype != "auto" else 1
                    )
            elif value in producer and producer[value] < i:
                edges[(producer[value], i, tensor_ids.setdefault(value, len(tensor_ids)))] = float(nbytes(value))
            elif value in graph_inputs:
                input_bytes[i] += nbytes(value)
            elif value in producer:
                raise InputError(
                    f"the ONNX graph is not in topological order (node {node.name or i} reads a later output)"
                )
        for u, unit in enumerate(units):
            compute[i, u] = unit.compute_us(ops, cls) if unit.supports(node.op_type, deploy, cls) else math.inf
    host = next(u for u, unit in enumerate(units) if unit.kind == "cpu" and "*" in unit.ops)
    lat = np.array(
        [
            [0.0 if a == b else max(units[a].transfer_latency_us, units[b].transfer_latency_us) for b in range(nu)]
            for a in range(nu)
        ]
    )
    per_byte = np.array(
        [
            [
                0.0 if a == b else 1.0 / (min(units[a].transfer_bandwidth_gbps, units[b].transfer_bandwidth_gbps) * 1e3)
                for b in range(nu)
            ]
            for a in range(nu)
        ]
    )
    edge_keys = sorted(edges)
    edge_list = np.array([(a, b) for a, b, _ in edge_keys], dtype=np.int64).reshape(-1, 2)
    return PartitionProblem(
        names=tuple(node.name or f"{node.op_type}_{i}" for i, node in enumerate(nodes)),
        op_types=tuple(node.op_type for node in nodes),
        unit_names=tuple(u.name for u in units),
        compute_us=compute,
        weight_bytes=weight_bytes,
        output_bytes=output_bytes,
        edges=edge_list,
        edge_bytes=np.array([edges[k] for k in edge_keys], dtype=float),
        edge_values=np.array([t for _, _, t in edge_keys], dtype=np.int64),
        input_bytes=input_bytes,
        result_bytes=result_bytes,
        capacity_bytes=np.array([u.memory_bytes for u in units], dtype=float),
        transfer_latency_us=lat,
        transfer_us_per_byte=per_byte,
        host=host,
        priority=tuple(u.priority for u in units),
        modules=tuple(_module_of(node.name) for node in nodes),
    )
