"""The backends registry (compiler/backends.py): a backend registered from outside the drivers, here a toy one that
reuses llvm's pieces under a kind of its own, compiles a kernel and a whole model, runs and profiles it and exports its
bundle, with no edit to build.py, bundle.py, the CLI or the server; and the registry's refusals."""

import dataclasses
import json

import numpy as np
import onnxruntime as ort
import pytest

import compiler
import compiler.te as te
from compiler import zoo
from compiler.backends import BACKENDS, Backend, backend_for
from compiler.build import compile_model, load_module
from compiler.bundle import BundleError
from compiler.errors import TargetError
from compiler.target import Target


@pytest.fixture
def toy(monkeypatch):
    """A backend of kind "toy" whose pieces are llvm's, called with the target's kind swapped back; `used` counts
    which of its pieces the drivers called."""
    llvm = BACKENDS["llvm"]
    used = []

    def as_llvm(target):
        return dataclasses.replace(target, kind="llvm")

    def build_kernel(func, target):
        used.append("build_kernel")
        return llvm.build_kernel(func, as_llvm(target))

    def kernel_runtime(library, target, num_threads):
        used.append("kernel_runtime")
        return llvm.kernel_runtime(library, as_llvm(target), num_threads)

    def build_model(kernels, run, manifest, target):
        used.append("build_model")
        return llvm.build_model(kernels, run, manifest, as_llvm(target))

    def model_runtime(image, target, num_threads):
        used.append("model_runtime")
        return llvm.model_runtime(image, as_llvm(target), num_threads)

    backend = Backend(
        kind="toy",
        code_file="toy.so",
        seal="elf",
        build_kernel=build_kernel,
        kernel_runtime=kernel_runtime,
        build_model=build_model,
        model_runtime=model_runtime,
        label="a toy backend",
    )
    monkeypatch.setitem(BACKENDS, "toy", backend)
    return dataclasses.replace(Target.parse("llvm"), kind="toy"), used


def test_a_registered_backend_builds_a_kernel(toy):
    target, used = toy
    a = te.placeholder((64,), name="a")
    b = te.compute((64,), lambda i: a[i] * 2.0 + 1.0, name="b")
    kernel = compiler.build(te.create_schedule(b.op), [a, b], target=target, name="affine")
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    y = np.empty_like(x)
    kernel(x, y)
    np.testing.assert_allclose(y, x * 2 + 1, rtol=1e-6)
    assert used == ["build_kernel", "kernel_runtime"]
    assert "define" in kernel.source("ll")


def test_a_registered_backend_compiles_runs_and_exports_a_model(toy, tmp_path):
    target, used = toy
    model = zoo.build_model("mlp")
    module = compile_model(model, target=target)
    assert used == ["build_model", "model_runtime"]
    feeds = zoo.sample_input("mlp")
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for actual, wanted in zip(module.run(feeds).values(), expected):
        np.testing.assert_allclose(actual, wanted, rtol=1e-4, atol=1e-5)
    assert len(module.profile(repeat=1)) == len(module.manifest["calls"])
    bundle = module.export(tmp_path / "toy.bundle")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["target"] == "toy" and manifest["code"] == "toy.so"
    assert sorted(path.name for path in bundle.iterdir()) == ["manifest.json", "params.bin", "toy.so"]


def test_the_server_offers_every_registered_backend(toy):
    from server.app import parse_targets, targets

    assert "toy" in targets() and parse_targets(["wasm,toy"]) == ["wasm", "toy"]


def test_a_kind_without_a_backend_is_one_error():
    with pytest.raises(TargetError, match="'toy' has no backend"):
        backend_for(dataclasses.replace(Target.parse("wasm"), kind="toy"))


def test_a_bundle_whose_code_file_is_not_its_targets_is_refused(tmp_path):
    bundle = compile_model(zoo.build_model("digits"), target="wasm").export(tmp_path / "digits")
    manifest = json.loads((bundle / "manifest.json").read_text())
    (bundle / "model.wasm").rename(bundle / "model.so")
    manifest["code"] = "model.so"
    manifest["files"] = {"model.so": manifest["files"].pop("model.wasm"), **manifest["files"]}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="manifest.code must be 'model.wasm' for target wasm"):
        load_module(bundle)
