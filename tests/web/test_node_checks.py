"""tessel.js in Node 20 checks what compiler/runtime checks: a Gather bundle with an index out of range
(onnxruntime refuses the same indices) and damaged or edited bundles; tests/web/checks.test.mjs holds the cases."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime
from node_helpers import run_node_tests
from onnx import TensorProto, helper

from compiler import compile_model
from compiler.bundle import binding_digest

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
    relu = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "relu",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 3])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    gather = compile_model(model, "wasm").export(tmp_path / "gather")
    cases = {
        "gather": str(gather),
        "other": str(compile_model(relu, "wasm").export(tmp_path / "relu")),
        "digests": _odd_manifests(json.loads((gather / "manifest.json").read_text())),
        "expected": expected,
        "scratch": str(tmp_path / "scratch"),
    }
    run_node_tests(NODE_TEST, "TESSEL_CHECK_CASES", cases, tmp_path, timeout=120)


def _odd_manifests(manifest: dict) -> list[dict]:
    """Manifest texts whose canonical form is easy to get wrong outside Python (floats as repr writes them, keys
    sorted by code point, non-ASCII and control characters escaped, big integers, repeated keys), each with the
    binding digest compiler/bundle.py computes for it."""
    odd = {
        "floats": [
            1.5,
            2.0,
            1e-05,
            0.0001,
            1e16,
            1e15,
            123456789.125,
            -0.0,
            0.1,
            1e300,
            -2.5e-07,
            5e-324,
            1.7976931348623157e308,
        ],
        "ints": [0, -7, 2**70, -(2**63)],
        "\u00e9t\u00e9": '\u00fc\u2603\U0001f600\x7f\x00\n\t"\\/',
        "\U0001f600": 1,
        "\uffff": 2,
        "Z": [True, False, None, {}, []],
    }
    texts = [
        json.dumps({**manifest, "options": odd}, indent=2),
        json.dumps({**manifest, "options": odd}, ensure_ascii=False),
        json.dumps({**manifest, "memory": {**manifest["memory"], "wasm_import": {"initial_pages": 9}}}),
        # a repeated key (Python keeps the last) and numbers spelled otherwise than repr would
        json.dumps(manifest)[:-1] + ', "options": {"a": 1}, "options": {"b": [1E2, 2.50, -0, 0.0e0]}}',
    ]
    return [{"text": text, "binding": binding_digest(json.loads(text))} for text in texts]
