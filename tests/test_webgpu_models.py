"""The webgpu backend end to end on lavapipe: compiler.build gives a callable kernel, compile_model a bundle whose
dispatch list runs through wgpu-py and matches onnxruntime, and load_module refuses damaged or swapped bundles."""

import json

import numpy as np
import onnxruntime
import pytest

import compiler.te as te
from compiler import zoo
from compiler.build import build, compile_model, load_module
from compiler.bundle import BundleError
from tests.model_checks import assert_close_in_range

# Lavapipe runs these in a few seconds each; the zoo's larger models are left to the full zoo run (docs/gpu.md).
MODELS = ["mlp", "digits", "dwconv_block", "inception_block", "squeezenet", "unet_small", "bert_tiny"]
DEFAULT_LIMITS = {
    "maxStorageBuffersPerShaderStage": 8,
    "maxComputeInvocationsPerWorkgroup": 256,
    "maxComputeWorkgroupStorageSize": 16384,
    "maxStorageBufferBindingSize": 134217728,
}


def test_build_gives_a_callable_webgpu_kernel():
    a = te.placeholder((1000,), name="A")
    b = te.compute((1000,), lambda i: te.erf(a[i]) * 2.0, name="B")
    s = te.create_schedule(b.op)
    block, thread = s[b].split(b.op.axis[0], 64)
    s[b].bind(block, te.thread_axis("blockIdx.x"))
    s[b].bind(thread, te.thread_axis("threadIdx.x"))
    kernel = build(s, [a, b], target="webgpu", name="scaled_erf")
    x = np.linspace(-4, 4, 1000, dtype="float32")
    y = np.zeros_like(x)
    kernel(x, y)
    from math import erf

    np.testing.assert_allclose(y, [2 * erf(value) for value in x], rtol=1e-5, atol=1e-6)
    assert "@compute @workgroup_size(64, 1, 1)" in kernel.source("wgsl")


@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_matches_onnxruntime(name):
    model = zoo.build_model(name)
    module = compile_model(model, target="webgpu")
    feeds = module.random_inputs()
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    for got, want in zip(module.run(feeds).values(), expected):
        assert_close_in_range(got, want)


def test_bundle_round_trip_and_refusals(tmp_path):
    model = zoo.build_model("inception_block")
    module = compile_model(model, target="webgpu")
    path = module.export(tmp_path / "bundle")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["code"] == "kernels.wgsl"
    # a dispatch per launch: one per call, three for each Winograd conv's
    assert sorted({dispatch["call"] for dispatch in manifest["dispatches"]}) == list(range(len(manifest["calls"])))
    assert len(manifest["dispatches"]) > len(manifest["calls"])
    limits = manifest["webgpu"]["limits"]
    assert all(limits[name] <= bound for name, bound in DEFAULT_LIMITS.items())
    feeds = module.random_inputs(seed=1)
    for got, want in zip(load_module(path).run(feeds).values(), module.run(feeds).values()):
        np.testing.assert_array_equal(got, want)

    code = (path / "kernels.wgsl").read_bytes()
    (path / "kernels.wgsl").write_bytes(code.replace(b"@compute", b"@compute ", 1))
    with pytest.raises(BundleError):
        load_module(path)


def test_compiling_needs_no_adapter_and_running_without_one_says_what_to_install(monkeypatch):
    import wgpu

    from compiler.errors import PlatformError
    from compiler.runtime import webgpu

    monkeypatch.setattr(webgpu, "_device", None)
    monkeypatch.setattr(wgpu.gpu, "request_adapter_sync", lambda **options: None)
    module = compile_model(zoo.build_model("digits"), target="webgpu")
    with pytest.raises(PlatformError, match="mesa-vulkan-drivers"):
        module.run(module.random_inputs())


def test_cli_run_and_bench_on_a_webgpu_bundle(tmp_path, capsys):
    from compiler.cli import main

    zoo.save_model("mlp", tmp_path / "mlp.onnx")
    assert main(["compile", str(tmp_path / "mlp.onnx"), "--target", "webgpu", "-o", str(tmp_path / "bundle")]) == 0
    assert main(["run", str(tmp_path / "bundle")]) == 0
    assert main(["bench", str(tmp_path / "bundle"), "--repeat", "3"]) == 0
    printed = capsys.readouterr().out
    assert "(webgpu)" in printed and "median" in printed


def test_a_dispatch_that_disagrees_with_its_entry_point_is_refused(tmp_path):
    directory = compile_model(zoo.build_model("mlp"), target="webgpu").export(tmp_path / "mlp")
    data = json.loads((directory / "manifest.json").read_text())
    data["dispatches"][0]["element_offsets"][0] += 16
    (directory / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="does not match its entry point"):
        load_module(directory)


def test_an_out_of_range_gather_index_raises_run_error_like_the_cpu_targets():
    from onnx import TensorProto, helper

    from compiler.errors import RunError

    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=0)],
        "gather",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3]), helper.make_tensor_value_info("i", 6, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    module = compile_model(model, target="webgpu")
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    for bad in (5, -6, 1000):
        with pytest.raises(RunError, match="index is out of range in Gather"):
            module.run({"x": x, "i": np.array([2, bad], np.int32)})
    got = module.run({"x": x, "i": np.array([2, -1], np.int32)})["y"]
    np.testing.assert_array_equal(got, x[[2, -1]])


def _int64_model(offsets: np.ndarray):
    """ids (int64) -> Gather rows of a float table, ids + offsets (an int64 constant) and the ids' shape (folded to a
    constant) as int64 outputs."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
            helper.make_node("Add", ["ids", "offsets"], ["shifted"]),
            helper.make_node("Shape", ["ids"], ["dims"]),
        ],
        "int64_ids",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
        [
            helper.make_tensor_value_info("rows", TensorProto.FLOAT, [4, 3]),
            helper.make_tensor_value_info("shifted", TensorProto.INT64, [4]),
            helper.make_tensor_value_info("dims", TensorProto.INT64, [1]),
        ],
        [
            numpy_helper.from_array(np.arange(30, dtype=np.float32).reshape(10, 3), "table"),
            numpy_helper.from_array(offsets, "offsets"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_int64_inputs_params_and_outputs_are_stored_as_int32_with_range_checks(tmp_path):
    from compiler.errors import ModelError, RunError

    model = _int64_model(np.array([1, -2, 3, 1 << 30], np.int64))
    module = compile_model(model, target="webgpu")
    assert [item.get("device_dtype") for item in module.manifest["inputs"]] == ["int32"]
    assert [item.get("device_dtype") for item in module.manifest["outputs"]] == [None, "int32", "int32"]
    feeds = {"ids": np.array([0, 9, -1, 4], np.int64)}
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    for runnable in (module, load_module(module.export(tmp_path / "bundle"))):
        got = list(runnable.run(feeds).values())
        assert [array.dtype for array in got] == [np.float32, np.int64, np.int64]
        for array, want in zip(got, expected):
            np.testing.assert_array_equal(array, want)
    with pytest.raises(RunError, match="input 'ids' holds int64 values outside int32's range"):
        module.run({"ids": np.array([0, 1, 2, 1 << 40], np.int64)})
    with pytest.raises(ModelError, match="constant 'offsets' holds int64 values outside int32's range"):
        compile_model(_int64_model(np.array([0, 0, 0, 1 << 31], np.int64)), target="webgpu")


def test_inputs_and_outputs_live_in_the_arena_so_each_kernel_has_one_entry_point(tmp_path):
    """bert_tiny's encoder layers share their kernels, and its first layer's read the model's input: with the input
    and output placed in the arena every dispatch binds params and the arena only, and each kernel has one entry
    point (one pipeline) instead of one per pattern of regions (docs/gpu.md). A bundle placing an input outside the
    arena or off a word, or binding a placed input as a buffer of its own, is refused by name."""
    model = zoo.build_model("bert_tiny")
    module = compile_model(model, target="webgpu")
    manifest = module.manifest
    entries = manifest["webgpu"]["entries"]
    assert len(entries) == len({entry["kernel"] for entry in entries})
    bound = {(region["region"], region["index"]) for d in manifest["dispatches"] for region in d["regions"]}
    assert bound <= {("params", 0), ("arena", 0)}
    slices = [buffer for buffer in manifest["webgpu"]["buffers"] if buffer["region"] in ("input", "output")]
    assert len(slices) == len(manifest["inputs"]) + len(manifest["outputs"])
    arena = manifest["memory"]["arena_bytes"]
    assert all(s["arena_offset"] % 4 == 0 and s["arena_offset"] + s["bytes"] <= arena for s in slices)
    feeds = module.random_inputs(seed=2)
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    for got, want in zip(module.run(feeds).values(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    directory = module.export(tmp_path / "bert_tiny")
    original = json.loads((directory / "manifest.json").read_text())

    def damaged(change, message):
        data = json.loads(json.dumps(original))
        change(data)
        (directory / "manifest.json").write_text(json.dumps(data))
        with pytest.raises(BundleError, match=message):
            load_module(directory)

    def place_input(offset):
        return lambda data: next(b for b in data["webgpu"]["buffers"] if b["region"] == "input").update(
            arena_offset=offset
        )

    damaged(place_input(arena), "not a whole word inside its")
    damaged(place_input(2), "not a whole word inside its")
    damaged(
        lambda data: data["dispatches"][0]["regions"].append({"region": "input", "index": 0}), "places in the arena"
    )
