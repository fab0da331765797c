"""tessel.js runs a bundle compiled with symbolic sizes (compile_model dims=): every size in its range from one bundle,
against onnxruntime on the same ONNX file and bit for bit against the Python runtime (compiler/runtime/wasm.py, the
same code under wasmtime), on one thread and on the threaded variant; and it refuses inputs outside the ranges, of
the wrong rank or whose sizes disagree, and manifests whose sizes or size expressions are wrong.
tests/web/sizes.test.mjs holds the cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
from node_helpers import _write_array, relu_model, run_node_tests
from onnx import TensorProto, helper, numpy_helper

from compiler import compile_model

NODE_TEST = Path(__file__).with_name("sizes.test.mjs")
DIMS = {"seq": (1, 40), "past": (1, 9)}
# (seq, past) of each run: both ends of both ranges and odd sizes between
RUNS = [(1, 1), (7, 3), (40, 9), (13, 1), (1, 9), (40, 1)]


def _model():
    """x [1, seq, 16] @ w [16, 8] + b + bias [seq, 8] -> Softmax over the last axis (y), its Transpose (t, [1, 8, seq]),
    its ReduceSum over seq (s, [1, 1, 8]); and Concat(past [past, 8], bias) (c, [past+seq, 8])."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([1], np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a0"]),
        helper.make_node("Add", ["a0", "bias"], ["a"]),
        helper.make_node("Softmax", ["a"], ["y"], axis=-1),
        helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1]),
        helper.make_node("ReduceSum", ["a", "axes"], ["s"], keepdims=1),
        helper.make_node("Concat", ["past", "bias"], ["c"], axis=0),
    ]
    value = helper.make_tensor_value_info
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "sizes",
        [value("x", f32, [1, "seq", 16]), value("bias", f32, ["seq", 8]), value("past", f32, ["past", 8])],
        [
            value("y", f32, [1, "seq", 8]),
            value("t", f32, [1, 8, "seq"]),
            value("s", f32, [1, 1, 8]),
            value("c", f32, ["past+seq", 8]),
        ],
        initializer=weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_node_runtime_runs_symbolic_sizes(tmp_path):
    model = _model()
    module = compile_model(model, target="wasm", dims=DIMS, wasm_variants=("threads",))
    bundle = module.export(tmp_path / "sizes")
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    runs = []
    for seq, past in RUNS:
        feeds = {
            "x": rng.standard_normal((1, seq, 16)).astype(np.float32),
            "bias": rng.standard_normal((seq, 8)).astype(np.float32),
            "past": rng.standard_normal((past, 8)).astype(np.float32),
        }
        expected = dict(zip([output.name for output in session.get_outputs()], session.run(None, feeds)))
        python = module.run(feeds)
        assert {name: array.shape for name, array in python.items()} == {
            name: array.shape for name, array in expected.items()
        }
        stem = tmp_path / f"run-{seq}-{past}"
        runs.append(
            {
                "seq": seq,
                "past": past,
                "inputs": {name: _write_array(Path(f"{stem}.in.{name}.bin"), array) for name, array in feeds.items()},
                "expected": {
                    name: _write_array(Path(f"{stem}.ort.{name}.bin"), array) for name, array in expected.items()
                },
                "python": {name: _write_array(Path(f"{stem}.py.{name}.bin"), array) for name, array in python.items()},
            }
        )
    static = compile_model(relu_model(), target="wasm").export(tmp_path / "static")
    cases = {"bundle": str(bundle), "static": str(static), "runs": runs, "scratch": str(tmp_path / "scratch")}
    run_node_tests(NODE_TEST, "TESSEL_SIZES_CASES", cases, tmp_path, timeout=120)
