"""The dense template's wasm blocks (compiler/schedules/cpu.py, VECTOR_DEFAULTS[16]["dense"]): 4 rows x 8 columns, and
a row tile above 4 (77 rows: 7) with fewer columns so the block keeps its accumulators; odd shapes against
onnxruntime."""

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.build import compile_model


def matmul_add(rows: int, depth: int, columns: int) -> onnx.ModelProto:
    rng = np.random.default_rng(rows * columns)
    weights = {
        "w": (rng.standard_normal((depth, columns)) / np.sqrt(depth)).astype(np.float32),
        "b": rng.standard_normal(columns).astype(np.float32),
    }
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["out"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, depth])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize(
    ("rows", "depth", "columns", "block"),
    [(128, 40, 24, (4, 8)), (77, 50, 700, (7, 4)), (77, 30, 36, (7, 4)), (21, 33, 40, (3, 8))],
)
def test_wasm_dense_block_fits_the_registers_and_matches_onnxruntime(rows, depth, columns, block):
    model = matmul_add(rows, depth, columns)
    module = compile_model(model, target="wasm")
    assert re.search(rf"allocate batch_matmul: float32\[1, {block[0]}, {block[1]}\] local", module.source("tir"))
    feeds = {"x": np.random.default_rng(4).standard_normal((1, rows, depth)).astype(np.float32)}
    (expected,) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    np.testing.assert_allclose(module.run(feeds)["out"], expected, rtol=1e-4, atol=1e-5)
