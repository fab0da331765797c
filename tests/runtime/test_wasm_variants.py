"""Threaded and relaxed-SIMD wasm: the variants a bundle carries beside its plain model.wasm (bundle.py), the shared
memory a threaded module imports and its thread pool (codegen/wasm_thread_pool.c), run in wasmtime."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import wasmtime

import compiler
from compiler import zoo
from compiler.build import EVERY_WASM_VARIANT, Module
from compiler.bundle import BundleError
from compiler.errors import TargetError


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory):
    module = compiler.compile_model(zoo.build_model("mlp"), target="wasm", wasm_variants=EVERY_WASM_VARIANT)
    return module, module.export(tmp_path_factory.mktemp("bundle") / "mlp")


def test_bundle_lists_each_variant_with_its_memory_and_digest(mlp_bundle):
    module, path = mlp_bundle
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["code"] == "model.wasm"
    assert [variant["code"] for variant in manifest["variants"]] == [
        "model.threads.wasm",
        "model.relaxed-simd.wasm",
        "model.threads.relaxed-simd.wasm",
    ]
    for variant in manifest["variants"]:
        assert variant["code"] in manifest["files"] and (path / variant["code"]).is_file()
        assert variant["wasm_import"].get("shared", False) == ("threads" in variant["features"])
    imports = wasmtime.Module(wasmtime.Engine(), (path / "model.wasm").read_bytes()).imports
    assert not imports[0].type.is_shared


def test_threaded_code_matches_plain_bit_for_bit_on_one_thread_and_on_two():
    """Alone (no worker joined) the pool runs every parallel loop on the calling thread; with a worker (a Python
    thread in its own wasmtime instance over the shared memory) the loops split, and each output element is still
    computed by the same code in the same order."""
    model = zoo.build_model("dwconv_block")
    plain = compiler.compile_model(model, target="wasm")
    threaded = compiler.compile_model(model, target="wasm -mattr=+atomics,+bulk-memory")
    feeds = plain.random_inputs(seed=3)
    assert "tessel_parallel" in threaded.source("ll") and "tessel_parallel" not in plain.source("ll")
    assert threaded.manifest["memory"]["wasm_import"]["shared"] is True
    expected = plain.run(feeds)
    for threads in (1, 2):
        module = Module(
            threaded.manifest, threaded.library, threaded.params, num_threads=threads, target=threaded.target
        )
        assert module.runtime.threads == threads
        for _ in range(3):
            found = module.run(feeds)
            for name in expected:
                np.testing.assert_array_equal(found[name], expected[name])
        instance = module.runtime.instance
        joins = instance.exports["tessel_pool_joins"](instance.store)
        assert (joins > 0) == (threads > 1)


def test_relaxed_simd_fuses_multiply_adds_and_stays_within_tolerance(mlp_bundle):
    module, _ = mlp_bundle
    relaxed = compiler.compile_model(zoo.build_model("mlp"), target="wasm -mattr=+relaxed-simd")
    assert "relaxed_madd" in relaxed.source("asm")
    feeds = module.random_inputs(seed=1)
    expected, found = module.run(feeds), relaxed.run(feeds)
    for name in expected:
        np.testing.assert_allclose(found[name], expected[name], rtol=1e-5, atol=1e-6)


def test_a_loaded_variant_bundle_runs_and_keeps_its_variants(mlp_bundle, tmp_path):
    module, path = mlp_bundle
    loaded = compiler.load_module(path)
    assert set(loaded.variants) == {variant["code"] for variant in module.manifest["variants"]}
    feeds = module.random_inputs(seed=2)
    np.testing.assert_array_equal(loaded.run(feeds)["output"], module.run(feeds)["output"])
    again = loaded.export(tmp_path / "again")
    assert (again / "model.threads.wasm").read_bytes() == (path / "model.threads.wasm").read_bytes()


def test_damaged_or_missing_variants_are_refused(mlp_bundle, tmp_path):
    module, _ = mlp_bundle
    path = module.export(tmp_path / "damaged")
    code = path / "model.threads.wasm"
    code.write_bytes(code.read_bytes()[:-1] + b"\0")
    manifest = json.loads((path / "manifest.json").read_text())
    with pytest.raises(BundleError, match="model.threads.wasm is corrupted"):
        compiler.load_module(path)
    # rehashed by hand: the seal still catches the damage
    manifest["files"]["model.threads.wasm"] = hashlib.sha256(code.read_bytes()).hexdigest()
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="model.threads.wasm is truncated or damaged"):
        compiler.load_module(path)
    manifest["variants"][0]["code"] = "model.other.wasm"
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="variant 0 names code 'model.other.wasm'"):
        compiler.load_module(path)


def test_unknown_variants_and_variants_of_native_targets_are_refused():
    with pytest.raises(TargetError, match="unknown wasm variant 'gpu'"):
        compiler.compile_model(zoo.build_model("mlp"), target="wasm", wasm_variants=("gpu",))
    with pytest.raises(TargetError, match="apply to the wasm target"):
        compiler.compile_model(zoo.build_model("mlp"), target="llvm", wasm_variants=("threads",))
