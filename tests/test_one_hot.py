"""OneHot against onnxruntime, natively and in wasm: every index in range gives its class, negatives count from
the end, and an index outside [-depth, depth) (5, 1000, -1000, 2**40, 2**32 + 1 for a depth of 5) gives a row of
off values, which is what onnxruntime answers (the op reads nothing at its indices, so nothing is out of bounds)."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from compiler import compile_model

INDICES = [0, 4, -1, -5, 5, 1000, -1000, 2**40, 2**32 + 1]


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_one_hot_matches_onnxruntime(axis, target):
    graph = helper.make_graph(
        [helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=axis)],
        "one_hot",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, [3, 3]),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("d", TensorProto.INT64, [1], [5])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    module = compile_model(model, target)
    feeds = {"i": np.array(INDICES, np.int64).reshape(3, 3), "v": np.array([0.5, 2.0], np.float32)}
    expected = session.run(None, feeds)[0]
    assert (expected == 0.5).all(axis=axis).sum() == 5  # the five indices out of range
    np.testing.assert_array_equal(module.run(feeds)["y"], expected)
