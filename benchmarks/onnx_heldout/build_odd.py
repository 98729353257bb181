"""Hand-built graphs with ops the unit tables may not know."""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

rng = np.random.default_rng(0)
OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/onnx_heldout/models"
os.makedirs(OUT, exist_ok=True)
B, C, H, W = "batch", 32, 64, 64
w1 = nh.from_array(rng.standard_normal((C, 3, 3, 3)).astype(np.float32), "conv.weight")
wm = nh.from_array(rng.standard_normal((W, W)).astype(np.float32), "proj.weight")
nodes = [
    h.make_node("Conv", ["x", "conv.weight"], ["c"], name="/stem/conv/Conv", pads=[1, 1, 1, 1]),
    h.make_node("GridSample", ["c", "grid"], ["g"], name="/warp/GridSample", align_corners=0),
    h.make_node("LpNormalization", ["g"], ["n"], name="/norm/LpNormalization", axis=1, p=2),
    h.make_node("Hardmax", ["n"], ["hm"], name="/sel/Hardmax", axis=-1),
    h.make_node("Einsum", ["n", "proj.weight"], ["e"], name="/proj/Einsum", equation="bchw,wv->bchv"),
    h.make_node("BiasGelu", ["e", "bias"], ["bg"], name="/act/BiasGelu", domain="com.microsoft"),
    h.make_node("Mul", ["bg", "hm"], ["m"], name="/mix/Mul"),
    h.make_node("Celu", ["m"], ["y"], name="/out/Celu", alpha=1.0),
]
bias = nh.from_array(rng.standard_normal((W,)).astype(np.float32), "bias")
g = h.make_graph(
    nodes,
    "odd_ops",
    [h.make_tensor_value_info("x", T.FLOAT, [B, 3, H, W]), h.make_tensor_value_info("grid", T.FLOAT, [B, H, W, 2])],
    [h.make_tensor_value_info("y", T.FLOAT, [B, C, H, W])],
    initializer=[w1, wm, bias],
)
m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
m.ir_version = 8
onnx.save(m, f"{OUT}/odd_ops.onnx")
np.savez(
    f"{OUT}/odd_ops.npz",
    x=rng.standard_normal((4, 3, H, W)).astype(np.float32),
    grid=rng.uniform(-1, 1, (4, H, W, 2)).astype(np.float32),
)
# an op no runtime knows: ORT must refuse it with one clear line; partition still costs it
nodes2 = [
    h.make_node("MatMul", ["x", "w"], ["a"], name="/a/MatMul"),
    h.make_node("MysteryOp", ["a"], ["b"], name="/b/MysteryOp", domain="com.example"),
    h.make_node("Relu", ["b"], ["y"], name="/c/Relu"),
]
g2 = h.make_graph(
    nodes2,
    "custom",
    [h.make_tensor_value_info("x", T.FLOAT, [8, 256])],
    [h.make_tensor_value_info("y", T.FLOAT, [8, 256])],
    initializer=[nh.from_array(rng.standard_normal((256, 256)).astype(np.float32), "w")],
)
m2 = h.make_model(g2, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.example", 1)])
m2.ir_version = 8
onnx.save(m2, f"{OUT}/custom_op.onnx")
np.savez(f"{OUT}/custom_op.npz", x=rng.standard_normal((8, 256)).astype(np.float32))
print("ok")
