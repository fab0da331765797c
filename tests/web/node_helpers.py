"""Runs one of tests/web's `node --test` files over cases a Python test wrote (bundles, inputs, expected outputs:
write_case), and fails with Node's report unless every Node test passed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

from compiler import compile_model, zoo


def run_node_tests(
    test_file: Path, cases_env: str, cases: dict, folder: Path, timeout: int, node_flags: tuple[str, ...] = ()
) -> None:
    """Write `cases` to folder/cases.json, name it in the environment variable `cases_env` and run `test_file`
    (with V8's `node_flags`, such as --experimental-wasm-relaxed-simd)."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node (Node.js 20) is not installed; run `make test`, which installs it")
    cases_file = folder / "cases.json"
    cases_file.write_text(json.dumps(cases, indent=2))
    completed = subprocess.run(
        [node, *node_flags, "--test", "--test-reporter=spec", str(test_file)],
        env={**os.environ, cases_env: str(cases_file)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    report = completed.stdout + completed.stderr
    assert completed.returncode == 0, f"node --test failed:\n{report}"
    assert re.search(r"\bfail 0\b", report) and not re.search(r"\bpass 0\b", report), report


def _write_array(path: Path, array: np.ndarray) -> dict:
    path.write_bytes(np.ascontiguousarray(array).tobytes())
    return {"file": str(path), "shape": list(array.shape), "dtype": str(array.dtype)}


def write_case(name: str, root: Path, wasm_variants: tuple[str, ...] = ()) -> dict:
    """A bundle of the zoo model `name` in root/name, a seeded input and onnxruntime's outputs for it."""
    model = zoo.build_model(name)
    bundle = compile_model(model, target="wasm", wasm_variants=wasm_variants).export(root / name)
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


def relu_model():
    """A static one-op model (Relu over float32 [2, 3]): a bundle with no sizes and no cache."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
