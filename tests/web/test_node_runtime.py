"""The JavaScript runtime (web_runtime/tessel.js) in Node 20 against onnxruntime: this file compiles the zoo's
`digits`, `mlp` and `mobilenet_v2` into WASM bundles, writes onnxruntime's outputs beside them, and hands
the lot to tests/web/runtime.test.mjs (`node --test`), which loads, runs, compares and checks the errors."""

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
    node = shutil.which("node")
    if node is None:
        pytest.fail("node (Node.js 20) is not installed; run `make test`, which installs it")
    cases = [_write_case(name, tmp_path) for name in MODELS]
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps({"cases": cases, "scratch": str(tmp_path / "scratch")}, indent=2))
    completed = subprocess.run(
        [node, "--test", "--test-reporter=spec", str(NODE_TEST)],
        env={**os.environ, "TESSEL_WEB_CASES": str(cases_file)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = completed.stdout + completed.stderr
    assert completed.returncode == 0, f"node --test failed:\n{report}"
    assert re.search(r"\bfail 0\b", report) and not re.search(r"\bpass 0\b", report), report
