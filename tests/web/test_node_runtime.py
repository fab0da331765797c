"""The JavaScript runtime (web_runtime/tessel.js) in Node 20 against onnxruntime: this file compiles the zoo's
`digits`, `mlp` and `mobilenet_v2` into WASM bundles, writes onnxruntime's outputs beside them, and hands
the lot to tests/web/runtime.test.mjs (`node --test`), which loads, runs, compares and checks the errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from node_helpers import run_node_tests, write_case

MODELS = ("digits", "mlp", "mobilenet_v2")
NODE_TEST = Path(__file__).with_name("runtime.test.mjs")


@pytest.mark.slow
def test_node_runtime_matches_onnxruntime(tmp_path):
    cases = [write_case(name, tmp_path) for name in MODELS]
    run_node_tests(NODE_TEST, "TESSEL_WEB_CASES", {"cases": cases, "scratch": str(tmp_path / "scratch")}, tmp_path, 300)
