"""tessel.js's int64 path in Node 20: a bundle whose input and outputs are int64 (BigInt64Array on the JavaScript
side) runs through web_runtime/tessel.js and gives onnxruntime's outputs; tests/web/int64.test.mjs holds the checks.
The model gathers rows by int64 indices (negative ones too), takes each row's ArgMax, and combines indices and
ArgMax into int64 values beyond 32 bits with either sign, so both halves of every element are compared."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
from node_helpers import run_node_tests
from onnx import TensorProto, helper, numpy_helper

from compiler import compile_model

NODE_TEST = Path(__file__).with_name("int64.test.mjs")


def int64_model():
    nodes = [
        helper.make_node("Gather", ["table", "indices"], ["rows"], axis=0),
        helper.make_node("ArgMax", ["rows"], ["best"], axis=1, keepdims=0),
        helper.make_node("Mul", ["indices", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "best"], ["code"]),
        helper.make_node("Cast", ["code"], ["code_float"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "int64_path",
        [
            helper.make_tensor_value_info("table", TensorProto.FLOAT, [6, 5]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, [4]),
        ],
        [
            helper.make_tensor_value_info("rows", TensorProto.FLOAT, [4, 5]),
            helper.make_tensor_value_info("code", TensorProto.INT64, [4]),
            helper.make_tensor_value_info("code_float", TensorProto.FLOAT, [4]),
        ],
        [numpy_helper.from_array(np.array([3 << 33], np.int64), "scale")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _write(path: Path, array: np.ndarray) -> dict:
    path.write_bytes(np.ascontiguousarray(array).tobytes())
    return {"file": str(path), "shape": list(array.shape), "dtype": str(array.dtype)}


def test_int64_inputs_and_outputs_match_onnxruntime(tmp_path):
    model = int64_model()
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    runs = []
    for run, indices in enumerate(([5, -1, 0, 2], [-6, 3, -3, 4])):
        feeds = {"table": rng.standard_normal((6, 5)).astype(np.float32), "indices": np.array(indices, np.int64)}
        expected = dict(zip([output.name for output in session.get_outputs()], session.run(None, feeds)))
        assert expected["code"].dtype == np.int64 and np.abs(expected["code"]).max() > 2**32
        runs.append(
            {
                "inputs": {name: _write(tmp_path / f"in{run}.{name}.bin", array) for name, array in feeds.items()},
                "expected": {
                    name: _write(tmp_path / f"out{run}.{name}.bin", array) for name, array in expected.items()
                },
            }
        )
    cases = {"bundle": str(compile_model(model, "wasm").export(tmp_path / "int64")), "runs": runs}
    run_node_tests(NODE_TEST, "TESSEL_INT64_CASES", cases, tmp_path, timeout=120)
