"""tessel.js's cache of bundle files hashes a file once per read, in Node 20 over HTTP with a Cache API made of a Map
(Node has none of its own): a download is hashed once, by the load's own check, before it is stored, and a second
load's cache hit once, as it is copied into memory; a damaged cache entry is still found, dropped and fetched again,
and refused when the server's copy is damaged too. crypto.subtle.digest is wrapped to record what it hashes;
tests/web/cache.test.mjs holds the checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
from node_helpers import run_node_tests
from onnx import TensorProto, helper

from compiler import compile_model
from compiler.build import EVERY_WASM_VARIANT

NODE_TEST = Path(__file__).with_name("cache.test.mjs")


def _matmul_model():
    """input [1, 640] @ a [640, 1024] weight: 2.5 MiB of params, three pieces of the chunked digest, the last short."""
    weight = np.random.default_rng(4).standard_normal((640, 1024)).astype(np.float32) * 0.05
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["output"])],
        "matmul",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, (1, 640))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, (1, 1024))],
        [helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.ravel())],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_cache_hit_is_hashed_once_and_a_damaged_entry_is_fetched_again(tmp_path):
    model = _matmul_model()
    bundle = compile_model(model, "wasm", wasm_variants=EVERY_WASM_VARIANT).export(tmp_path / "matmul")
    feeds = {"input": np.random.default_rng(5).standard_normal((1, 640)).astype(np.float32)}
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (tmp_path / "input.bin").write_bytes(feeds["input"].tobytes())
    (tmp_path / "output.bin").write_bytes(session.run(None, feeds)[0].tobytes())
    cases = {"bundle": str(bundle), "input": str(tmp_path / "input.bin"), "output": str(tmp_path / "output.bin")}
    run_node_tests(NODE_TEST, "TESSEL_CACHE_CASES", cases, tmp_path, timeout=300)
