"""The JavaScript runtime (web_runtime/tessel.js) in Node 20 against onnxruntime: this file compiles the zoo's
`digits`, `mlp` and `mobilenet_v2` into WASM bundles, writes onnxruntime's outputs beside them, and hands
the lot to tests/web/runtime.test.mjs (`node --test`), which loads, runs, compares and checks the errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from node_helpers import run_node_tests

from compiler import compile_model, zoo

MODELS = ("digits", "mlp", "mobilenet_v2")
NODE_TEST = Path(__file__).with_name("runtime.test.mjs")


def _write_array(path: Path, array: np.ndarray) -> dict:
    path.write_bytes(np.ascontiguousarray(array).tobytes())
    return {"file": str(path), "shape": list(array.shape), "dtype": str(array.dtype)}


def _write_case(name: str, root: Path) -> dict:
    model = zoo.build_model(name)
    bundle = compile_model(model, target="wasm").export(root / name)
    feeds = zoo.sample_input(name, seed=1)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    results = session.run(None, feeds)
    return {
        "name": name,
        "bundle": str(bundle),
        "inputs": {key: _write_array(root / f"{name}.in.{key}.bin", array) for key, array in feeds.items()},
        "expected": {
            output.name: _write_array(root / f"{name}.out.{output.name}.bin", result)
            for output, result in zip(session.get_outputs(), results)
        },
    }


@pytest.mark.slow
def test_node_runtime_matches_onnxruntime(tmp_path):
    cases = [_write_case(name, tmp_path) for name in MODELS]
    run_node_tests(NODE_TEST, "TESSEL_WEB_CASES", {"cases": cases, "scratch": str(tmp_path / "scratch")}, tmp_path, 300)
