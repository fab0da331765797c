"""Module.profile and Module.replay (build.py): every fused group's kernel called on its own from the host
gives one positive time per group in graph order and the same outputs as `run` and as onnxruntime; and a
native module with one thread never enters its thread pool (the pool counts no job)."""

import numpy as np
import onnxruntime as ort
import pytest

import compiler
from compiler import te, zoo
from compiler.errors import TesselError


def _onnxruntime(name: str, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(zoo.build_model(name).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("target", ["llvm", "wasm"])
@pytest.mark.parametrize("name", ["mlp", "digits"])
def test_profile_gives_one_positive_time_per_group_in_order(name, target):
    module = compiler.compile_model(zoo.build_model(name), target=target)
    feeds = zoo.sample_input(name)
    profile = module.profile(repeat=3, feeds=feeds)
    calls = module.manifest["calls"]
    assert [entry["group"] for entry in profile] == [call["group"] for call in calls]
    assert [entry["kernel"] for entry in profile] == [call["kernel"] for call in calls]
    kernel_ops = {kernel["name"]: kernel["ops"] for kernel in module.manifest["kernels"]}
    for entry in profile:
        assert entry["median_ms"] > 0 and 0 < entry["min_ms"] <= entry["median_ms"]
        assert entry["ops"] == kernel_ops[entry["kernel"]] and entry["ops"]
        assert entry["pattern"]


@pytest.mark.parametrize("target", ["llvm", "wasm"])
@pytest.mark.parametrize("name", ["mlp", "digits"])
def test_replaying_the_groups_one_by_one_gives_the_run_outputs(name, target):
    module = compiler.compile_model(zoo.build_model(name), target=target)
    feeds = zoo.sample_input(name)
    replayed, times = module.replay(feeds, repeat=2)
    assert len(times) == len(module.manifest["calls"]) and all(len(samples) == 2 for samples in times)
    run = module.run(feeds)
    expected = _onnxruntime(name, feeds)
    for spec, reference in zip(module.outputs, expected):
        np.testing.assert_array_equal(replayed[spec.name], run[spec.name])
        np.testing.assert_allclose(replayed[spec.name], reference, rtol=1e-4, atol=1e-5)


def test_a_module_loaded_from_a_bundle_can_be_profiled(tmp_path):
    compiler.compile_model(zoo.build_model("digits"), target="llvm").export(tmp_path / "digits")
    module = compiler.load_module(tmp_path / "digits")
    feeds = zoo.sample_input("digits")
    replayed, _ = module.replay(feeds)
    np.testing.assert_allclose(replayed[module.outputs[0].name], _onnxruntime("digits", feeds)[0], rtol=1e-4, atol=1e-5)
    assert len(module.profile(repeat=1)) == len(module.manifest["calls"])


def test_profile_repeat_below_one_is_refused():
    module = compiler.compile_model(zoo.build_model("digits"), target="llvm")
    with pytest.raises(TesselError, match="repeat must be at least 1"):
        module.replay(zoo.sample_input("digits"), repeat=0)


def test_one_thread_runs_parallel_loops_without_the_thread_pool():
    size = 1 << 16
    x = te.placeholder((size,), name="x")
    y = te.compute((size,), lambda i: x[i] * 2.0 + 1.0, name="y")
    schedule = te.create_schedule(y.op)
    outer, inner = schedule[y].split(y.op.axis[0], factor=16)
    schedule[y].parallel(outer)
    kernel = compiler.build(schedule, [x, y], target="llvm", name="affine", num_threads=1)
    data = np.arange(size, dtype="float32")
    result = np.zeros_like(data)
    kernel(data, result)
    np.testing.assert_array_equal(result, data * 2 + 1)
    assert kernel.runtime.pool_jobs == 0
    kernel.num_threads = 2
    kernel(data, np.zeros_like(data))
    assert kernel.runtime.pool_jobs == 1


def test_module_thread_count_can_be_changed_and_gives_the_same_outputs():
    module = compiler.compile_model(zoo.build_model("mlp"), target="llvm", num_threads=1)
    feeds = zoo.sample_input("mlp")
    assert module.num_threads == 1
    one = module.run(feeds)
    module.num_threads = 2
    assert module.num_threads == 2
    two = module.run(feeds)
    expected = _onnxruntime("mlp", feeds)
    for spec, reference in zip(module.outputs, expected):
        np.testing.assert_allclose(one[spec.name], reference, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(two[spec.name], reference, rtol=1e-4, atol=1e-5)
    with pytest.raises(TesselError, match="num_threads"):
        module.num_threads = -1
