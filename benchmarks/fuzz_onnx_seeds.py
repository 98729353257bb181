"""Seeds and hostile builders for benchmarks/bench_fuzz_onnx.py and tests/test_onnx_security.py:
a small valid ONNX model, its feeds, a safetensors header, and the attack campaign's inputs
(a ConstantOfShape bomb, an unbounded Loop, external data, escape sequences, a deflate bomb)."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

ESC = "\x1b]0;pwned\x07\x1b[2J"

# ----------------------------


def tiny_model(*, name: str = "mm") -> Any:
    """x[batch, 4] @ W[4, 3] + b[3]: the seed every ONNX mutation starts from."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "W")
    b = numpy_helper.from_array(np.ones(3, dtype=np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name=f"/{name}/MatMul"),
        helper.make_node("Add", ["h", "b"], ["y"], name=f"/{name}/Add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def tiny_feeds() -> dict[str, np.ndarray]:
    return {"x": np.ones((2, 4), dtype=np.float32)}


def constant_of_shape_model(n: int) -> Any:
    """191 bytes that declare an ``n``-element tensor: ``ConstantOfShape([n])``."""
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([n], dtype=np.int64), "s")
    node = helper.make_node(
        "ConstantOfShape", ["s"], ["y"], name="cos", value=helper.make_tensor("v", TensorProto.INT64, [1], [1])
    )
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.INT64, [None])], [shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def loop_model(trips: int | None) -> Any:
    """A ``Loop`` adding 1 to a counter ``trips`` times (None: the trip count is an input, ``M``)."""
    from onnx import TensorProto, helper, numpy_helper

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1]),
        ],
        [numpy_helper.from_array(np.ones(1, dtype=np.float32), "one")],
    )
    inits = [numpy_helper.from_array(np.array(True), "cond")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])]
    if trips is None:
        inputs.append(helper.make_tensor_value_info("M", TensorProto.INT64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(trips, dtype=np.int64), "M"))
    node = helper.make_node("Loop", ["M", "cond", "x"], ["y"], name="/loop/Loop", body=body)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def external_model(folder: Path, dims: list[int], *, location: str = "w.bin", data: bytes | None = bytes(64)) -> Path:
    """A model whose initializer ``W`` of ``dims`` lives in an external file (``data`` written to it)."""
    import onnx
    from onnx import TensorProto, helper

    model = tiny_model()
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    del w.dims[:]
    w.dims.extend(dims)
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    model.graph.ClearField("value_info")
    del model.graph.node[:]
    model.graph.node.extend([helper.make_node("MatMul", ["x", "W"], ["y"], name="/mm/MatMul")])
    if data is not None and "/" not in location and location != "fifo":
        (folder / location).write_bytes(data)
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    return path


def named_model(name: str) -> Any:
    """The seed with a node name of the caller's choosing (escape sequences, markup)."""
    model = tiny_model()
    model.graph.node[0].name = name
    return model


def npz_bytes(members: dict[str, bytes], *, compress: bool = False) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=False)
    return buf.getvalue()


def npz_bomb(elements: int) -> bytes:
    """An npz whose one member declares and inflates to ``elements`` float32 zeros (a few hundred KiB
    to a MiB compressed): the bytes are made without holding them."""
    import zlib

    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f4", "fortran_order": False, "shape": (elements,)})
    header = head.getvalue()
    total = len(header) + 4 * elements
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts, crc, chunk = [comp.compress(header)], zlib.crc32(header), bytes(1 << 20)
    left = 4 * elements
    while left:
        piece = chunk[: min(left, len(chunk))]
        parts.append(comp.compress(piece))
        crc = zlib.crc32(piece, crc)
        left -= len(piece)
    parts.append(comp.flush())
    body = b"".join(parts)
    name = b"x.npy"
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, crc, len(body), total, len(name), 0) + name
    central = (
        struct.pack(
            "<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0, crc, len(body), total, len(name), 0, 0, 0, 0, 0, 0
        )
        + name
    )
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), len(local) + len(body), 0)
    return local + body + central + end


def safetensors_bytes(header: dict[str, Any], data_len: int) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(data_len)


def seed_header() -> dict[str, Any]:
    return {
        "a": {"dtype": "F16", "shape": [4, 4], "data_offsets": [0, 32]},
        "b": {"dtype": "F32", "shape": [8], "data_offsets": [32, 64]},
        "__metadata__": {"format": "pt"},
    }
