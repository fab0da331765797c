"""Register blocks sized for V8's 16 registers on wasm (compiler/schedules/cpu/defaults.py, VECTOR_DEFAULTS[16]): the dense
template's 4 rows x 8 columns (attention's MatMuls of two computed operands), a row tile above 4 (77 rows: 7) with
fewer columns so the block keeps its accumulators, a MatMul by a param weight's 4 rows x one packed panel of 8
columns, and an NCHW conv's 2 channels x 16 columns; odd shapes against onnxruntime."""

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.build import compile_model


def matmul_add(rows: int, depth: int, columns: int, weight_input: bool = False) -> tuple[onnx.ModelProto, np.ndarray]:
    """x @ w + b; w a param, or (weight_input) an input of the model as attention's second operand is."""
    rng = np.random.default_rng(rows * columns)
    weights = {
        "w": (rng.standard_normal((depth, columns)) / np.sqrt(depth)).astype(np.float32),
        "b": rng.standard_normal(columns).astype(np.float32),
    }
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, depth])]
    if weight_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [depth, columns]))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["out"])],
        "matmul",
        inputs,
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(array, name) for name, array in weights.items() if not (weight_input and name == "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), weights["w"]


@pytest.mark.parametrize("weight_input", [True, False])
@pytest.mark.parametrize(
    ("rows", "depth", "columns", "block", "packed_block"),
    [
        (128, 40, 24, (4, 8), (4, 8)),
        (77, 50, 700, (7, 4), (4, 8)),
        (77, 30, 36, (7, 4), (4, 8)),
        (21, 33, 40, (3, 8), (4, 8)),
    ],
)
def test_wasm_dense_block_fits_the_registers_and_matches_onnxruntime(
    rows, depth, columns, block, packed_block, weight_input
):
    model, weight = matmul_add(rows, depth, columns, weight_input)
    module = compile_model(model, target="wasm")
    anchor, (block_rows, block_columns) = ("batch_matmul", block) if weight_input else ("dense_packed", packed_block)
    assert re.search(rf"allocate {anchor}: float32\[1, {block_rows}, {block_columns}\] local", module.source("tir"))
    feeds = {"x": np.random.default_rng(4).standard_normal((1, rows, depth)).astype(np.float32)}
    if weight_input:
        feeds["w"] = weight
    (expected,) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    np.testing.assert_allclose(module.run(feeds)["out"], expected, rtol=1e-4, atol=1e-5)


def grouped_dilated_conv(width: int) -> onnx.ModelProto:
    """odd_convnet's pattern: a 3-group dilated 3x3 conv (15 -> 15 channels per group, not whole blocks) + ReLU."""
    rng = np.random.default_rng(width)
    weights = {"w": (rng.standard_normal((45, 15, 3, 3)) / 12).astype(np.float32)}
    attrs = {"kernel_shape": [3, 3], "group": 3, "dilations": [2, 2], "pads": [2, 2, 2, 2]}
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], **attrs), helper.make_node("Relu", ["y"], ["out"])],
        "grouped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 45, 5, width])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("width", [66, 19])
def test_wasm_nchw_conv_keeps_two_channels_of_vectors_and_matches_onnxruntime(width):
    model = grouped_dilated_conv(width)
    module = compile_model(model, target="wasm")
    # 45 channels: the largest divisor up to 2 is 1, so 1 x 16 columns (4 accumulators; the old 8 x 16 took 5 x 16)
    assert re.findall(r"allocate conv: float32\[([\d, ]+)\] local", module.source("tir")) == ["1, 1, 1, 16"] * 2
    feeds = {"x": np.random.default_rng(5).standard_normal((1, 45, 5, width)).astype(np.float32)}
    (expected,) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    np.testing.assert_allclose(module.run(feeds)["out"], expected, rtol=1e-4, atol=1e-5)
