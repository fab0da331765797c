"""Threaded and relaxed-SIMD wasm in Node 20 (web_runtime/tessel.js over worker_threads): this file compiles `mlp`,
`digits` and `dwconv_block` with every wasm variant, writes onnxruntime's outputs beside them and hands them to
tests/web/threads.test.mjs, run once as Node 20 ships (no relaxed SIMD) and once with relaxed SIMD switched on."""

from __future__ import annotations

from pathlib import Path

import pytest
from node_helpers import run_node_tests, write_case

from compiler import compile_model, zoo
from compiler.build import EVERY_WASM_VARIANT

MODELS = ("mlp", "digits", "dwconv_block")
NODE_TEST = Path(__file__).with_name("threads.test.mjs")


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("threads")
    written = [write_case(name, root, wasm_variants=EVERY_WASM_VARIANT) for name in MODELS]
    # digits with its plain code only (tessel compile --wasm-variants none)
    plain = compile_model(zoo.build_model("digits"), "wasm").export(root / "digits-plain")
    return root, written, str(plain)


@pytest.mark.parametrize("relaxed", [False, True], ids=["node-default", "relaxed-simd"])
def test_threaded_wasm_in_node(cases, relaxed, tmp_path):
    root, written, plain = cases
    flags = ("--experimental-wasm-relaxed-simd",) if relaxed else ()
    payload = {"cases": written, "plain": plain, "scratch": str(tmp_path / "scratch"), "relaxed": relaxed}
    run_node_tests(NODE_TEST, "TESSEL_WEB_CASES", payload, tmp_path, 300, node_flags=flags)
