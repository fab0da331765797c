"""DequantizeLinear (compiler/graph/ops/quantize.py, compiler/compute/quantize.py) compiled for the host and wasm
against onnxruntime on the same file: per-tensor, per-axis and blocked scales (a ragged last block), with and without
a zero point, int8, uint8 and int32 inputs, a float16 scale, and a dequantized weight feeding a MatMul as the QDQ
form writes it. The ONNX node tests cover it too (test_node_tests_compiled.py)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from compiler.errors import TesselError

TARGETS = ["llvm", "wasm"]
RNG = np.random.default_rng(7)
ONNX_TYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int32": TensorProto.INT32}


def dequantize_model(x_shape, dtype, scale, zero_point=None, opset=21, **attrs) -> onnx.ModelProto:
    """x (a graph input of `dtype`) dequantized by the constant `scale` (and `zero_point`), then doubled, so the
    DequantizeLinear is fused with a reader as in a real graph."""
    inputs = ["x", "scale"] + (["zero_point"] if zero_point is not None else [])
    initializers = [numpy_helper.from_array(scale, "scale")]
    if zero_point is not None:
        initializers.append(numpy_helper.from_array(zero_point, "zero_point"))
    out_type = helper.np_dtype_to_tensor_dtype(scale.dtype)
    nodes = [
        helper.make_node("DequantizeLinear", inputs, ["dequantized"], **attrs),
        helper.make_node("Add", ["dequantized", "dequantized"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dequantize",
        [helper.make_tensor_value_info("x", ONNX_TYPES[dtype], x_shape)],
        [helper.make_tensor_value_info("y", out_type, x_shape)],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def integers(shape, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    low, high = max(info.min, -1000), min(info.max, 1000)
    return RNG.integers(low, high + 1, shape).astype(dtype)


def check(model: onnx.ModelProto, feeds: dict, target: str) -> None:
    """The compiled model against onnxruntime's unoptimised session: optimised, onnxruntime turns a dequantized
    weight's MatMul into an integer one, whose rounding is not the float graph's."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    module = compiler.compile_model(model, target=target)
    (name,) = [output.name for output in model.graph.output]
    np.testing.assert_allclose(module.run(feeds)[name], expected[0], rtol=1e-5, atol=1e-5)


CASES = {
    "tensor-uint8": ((2, 3, 5), "uint8", np.array(0.05, np.float32), np.array(128, np.uint8), {}),
    "tensor-int32": ((4, 33), "int32", np.array(0.001, np.float32), None, {}),
    "axis-int8": ((3, 4, 17), "int8", RNG.uniform(0.01, 0.1, 4).astype(np.float32), integers(4, np.int8), {}),
    "axis-last": ((2, 19), "int8", RNG.uniform(0.01, 0.1, 19).astype(np.float32), None, {"axis": -1}),
    "block-ragged": (
        (6, 10),
        "int8",
        RNG.uniform(0.01, 0.1, (6, 3)).astype(np.float32),
        integers((6, 3), np.int8),
        {"axis": 1, "block_size": 4},
    ),
    "float16-scale": ((3, 8), "uint8", np.array([0.02, 0.04, 0.08], np.float16), None, {"axis": 0}),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES)
def test_dequantize_matches_onnxruntime(case, target):
    shape, dtype, scale, zero_point, attrs = CASES[case]
    model = dequantize_model(shape, dtype, scale, zero_point, **attrs)
    check(model, {"x": integers(shape, np.dtype(dtype))}, target)


@pytest.mark.parametrize("target", TARGETS)
def test_a_dequantized_weight_feeds_a_matmul(target):
    """The QDQ form of a quantized Linear: an int8 weight per output column, dequantized, then a float MatMul."""
    weight = integers((24, 16), np.int8)
    scale = RNG.uniform(0.001, 0.01, 16).astype(np.float32)
    nodes = [
        helper.make_node("DequantizeLinear", ["weight", "scale"], ["w"], axis=1),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq_linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (5, 24))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (5, 16))],
        [numpy_helper.from_array(weight, "weight"), numpy_helper.from_array(scale, "scale")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    check(model, {"x": RNG.standard_normal((5, 24)).astype(np.float32)}, target)


@pytest.mark.parametrize(
    "scale, zero_point, attrs, message",
    [
        (np.ones(5, np.float32), None, {"axis": 1}, "per-axis scale must have shape \\(4,\\)"),
        (np.ones((3, 3), np.float32), None, {"axis": 1, "block_size": 3}, "must have shape \\[3, 2\\]"),
        (np.ones(4, np.float32), np.zeros(4, np.uint8), {"axis": 1}, "is uint8 but input 0 .* is int8"),
        (np.ones(4, np.float32), np.zeros(3, np.int8), {"axis": 1}, "zero point must have .* the scale's shape"),
    ],
)
def test_a_bad_scale_or_zero_point_is_one_clear_error(scale, zero_point, attrs, message):
    model = dequantize_model((3, 4), "int8", scale, zero_point, **attrs)
    with pytest.raises(TesselError, match=message):
        compiler.compile_model(model, target="llvm")
