"""tessel.js in Node 20 checks what compiler/runtime checks: a Gather bundle with an index out of range
(onnxruntime refuses the same indices) and damaged or edited bundles; tests/web/checks.test.mjs holds the cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
from node_helpers import run_node_tests
from onnx import TensorProto, helper

from compiler import compile_model

NODE_TEST = Path(__file__).with_name("checks.test.mjs")


def test_node_runtime_refuses_bad_indices_and_damaged_bundles(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=0)],
        "gather",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3]),
            helper.make_tensor_value_info("i", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    expected = {
        str(index): session.run(None, {"x": x, "i": np.array([2, index], np.int64)})[0].ravel().tolist()
        for index in (-1, -5, 4)
    }
    cases = {
        "gather": str(compile_model(model, "wasm").export(tmp_path / "gather")),
        "expected": expected,
        "scratch": str(tmp_path / "scratch"),
    }
    run_node_tests(NODE_TEST, "TESSEL_CHECK_CASES", cases, tmp_path, timeout=120)
