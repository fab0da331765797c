"""Whole models on the C-dialect GPU backends: compile_model for opencl runs on PoCL and matches onnxruntime, its
bundle round-trips through export and load_module (a swapped code file, a dispatch outside its region are refused),
`tessel run` and `tessel bench` work on it, the CUDA bundles' kernels compile with NVRTC for sm_80 and sm_90, and,
marked `gpu`, they run on a CUDA device where one answers."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest

import compiler
from compiler import zoo
from compiler.bundle import BundleError
from compiler.cli import main
from compiler.errors import PlatformError
from compiler.runtime import cuda as cuda_runtime

MODELS = ["mlp", "digits", "dwconv_block"]


def expected(name: str, inputs: dict) -> np.ndarray:
    model = zoo.build_model(name)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


@pytest.mark.parametrize("name", MODELS)
def test_model_on_opencl_matches_onnxruntime(name, tmp_path):
    inputs = zoo.sample_input(name)
    module = compiler.compile_model(zoo.build_model(name), target="opencl")
    assert [dispatch["kernel"] for dispatch in module.manifest["dispatches"]] == [
        call["kernel"] for call in module.manifest["calls"]
    ]
    (output,) = module.run(inputs).values()
    np.testing.assert_allclose(output, expected(name, inputs), rtol=1e-4, atol=1e-5)
    loaded = compiler.load_module(module.export(tmp_path / name))
    (again,) = loaded.run(inputs).values()
    np.testing.assert_array_equal(again, output)
    outputs, times = loaded.replay(inputs)
    np.testing.assert_array_equal(next(iter(outputs.values())), output)
    assert len(times) == len(module.manifest["calls"])


def test_bundle_with_another_models_code_is_refused(tmp_path):
    first = compiler.compile_model(zoo.build_model("mlp"), target="opencl").export(tmp_path / "mlp")
    second = compiler.compile_model(zoo.build_model("digits"), target="opencl").export(tmp_path / "digits")
    shutil.copy(second / "kernels.cl", first / "kernels.cl")
    # the manifest's file digest is what anyone editing a bundle recomputes; the binding digest still differs
    data = json.loads((first / "manifest.json").read_text())
    data["files"]["kernels.cl"] = hashlib.sha256((first / "kernels.cl").read_bytes()).hexdigest()
    (first / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="not generated for this manifest"):
        compiler.load_module(first)


def test_dispatch_outside_its_region_is_refused(tmp_path):
    directory = compiler.compile_model(zoo.build_model("mlp"), target="opencl").export(tmp_path / "mlp")
    data = json.loads((directory / "manifest.json").read_text())
    data["dispatches"][0]["bindings"][0]["offset"] = data["memory"]["arena_bytes"] + 4096
    (directory / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="outside it"):
        compiler.load_module(directory)


def test_cli_run_and_bench_on_an_opencl_bundle(tmp_path, capsys):
    zoo.save_model("mlp", tmp_path / "mlp.onnx")
    assert main(["compile", str(tmp_path / "mlp.onnx"), "--target", "opencl", "-o", str(tmp_path / "bundle")]) == 0
    assert main(["run", str(tmp_path / "bundle")]) == 0
    assert main(["bench", str(tmp_path / "bundle"), "--repeat", "3"]) == 0
    printed = capsys.readouterr().out
    assert "(opencl)" in printed and "median" in printed


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", MODELS)
def test_cuda_bundle_compiles_with_nvrtc(name, arch, tmp_path):
    module = compiler.compile_model(zoo.build_model(name), target=f"cuda -arch={arch}")
    assert module.runtime.program.cubin[:4] == b"\x7fELF"
    source = module.sources["cu"]
    assert source.count('extern "C" __global__') == len(module.manifest["kernels"])
    assert (module.export(tmp_path / name) / "kernels.cu").read_bytes().startswith(b"// tessel_manifest_digest ")


@pytest.mark.gpu
@pytest.mark.parametrize("name", MODELS)
def test_model_on_a_cuda_device_matches_onnxruntime(name, tmp_path):
    try:
        arch = cuda_runtime.device_arch()
    except PlatformError as error:
        pytest.skip(f"no CUDA device: {error}")
    inputs = zoo.sample_input(name)
    module = compiler.compile_model(zoo.build_model(name), target=f"cuda -arch={arch}")
    (output,) = module.run(inputs).values()
    np.testing.assert_allclose(output, expected(name, inputs), rtol=1e-4, atol=1e-5)
    (again,) = compiler.load_module(module.export(tmp_path / name)).run(inputs).values()
    np.testing.assert_array_equal(again, output)
    outputs, times = module.replay(inputs)
    np.testing.assert_array_equal(next(iter(outputs.values())), output)
