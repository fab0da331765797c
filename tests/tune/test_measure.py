"""Measuring candidates (compiler/tune/measure.py): real configs of a real task are built in worker processes and
timed after their outputs match the fallback's; candidates that crash, hang, compute a wrong result or fail to build
are recorded with their error and the measurements after them go on."""

import functools
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from compiler.graph.ir import Graph, TensorType
from compiler.tune.measure import Built, LocalBuilder, Measurer, build_candidate, flops, mismatch
from compiler.tune.task import extract_tasks

RNG = np.random.default_rng(0)


def small_conv_task(target="llvm"):
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 12, 12), "float32"))
    weight = graph.add_param("w", RNG.standard_normal((16, 8, 3, 3)).astype("float32"))
    (y,) = graph.add_node("Conv", [x, weight], {"pads": [1, 1, 1, 1]})
    (y,) = graph.add_node("Relu", [y])
    graph.outputs = [y]
    (task,) = extract_tasks(graph, target)
    return task


def _c_library(body: str, arguments: int) -> bytes:
    """A shared library whose `candidate(...)` is the C `body` over pointer arguments p0, p1, ..."""
    parameters = ", ".join(f"float *p{position}" for position in range(arguments))
    with tempfile.TemporaryDirectory() as folder:
        source, library = Path(folder, "broken.c"), Path(folder, "broken.so")
        # the runtime sets the library's thread count before any call
        source.write_text(f"int tessel_num_threads;\nvoid candidate({parameters}) {{ {body} }}\n")
        subprocess.run(["cc", "-O0", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
        return library.read_bytes()


BROKEN = {
    # a real null-pointer store: the runner process dies of SIGSEGV
    "crash": "volatile float *nowhere = 0; *nowhere = 1.0f;",
    "hang": "volatile int forever = 1; while (forever) {}",
    # writes one element of the output and leaves the rest as the runner filled it
    "wrong": "p{last}[0] = 1.0f;",
}


def broken_build(plan: dict, job):
    """The real builder, except for the configs `plan` names (config JSON -> how to break it)."""
    how = plan.get(json.dumps(job.config, sort_keys=True))
    if how == "builder crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if how == "build error":
        raise ValueError("a template bug")
    built = build_candidate(job)
    if how in BROKEN:
        body = BROKEN[how].replace("{last}", str(len(built.specs) - 1))
        built.library = _c_library(body, len(built.specs))
    return built


def test_real_configs_are_timed_and_agree_with_the_fallback():
    task = small_conv_task()
    configs = list(task.space.valid_configs())[:3]
    seen = []
    with Measurer(task, workers=2, callbacks=[lambda task, result: seen.append(result)]) as measurer:
        results = measurer.measure(configs)
        again = measurer.measure(configs[:1])
    # the fallback is measured first, once: what a report compares the best config with
    assert measurer.default.config == task.space.fallback and measurer.default.seconds > 0
    assert [result.config for result in results] == configs and seen == [measurer.default, *results, *again]
    for result in [*results, *again]:
        assert result.error is None and 0 < result.seconds < 1 and result.build_seconds > 0
    assert flops(task) == 2 * 16 * 12 * 12 * 8 * 3 * 3


def test_broken_candidates_are_recorded_and_the_search_goes_on():
    task = small_conv_task()
    configs = list(task.space.valid_configs())[:6]
    kinds = ["crash", "builder crash", "hang", "build error", "wrong", None]
    plan = {json.dumps(config.to_json(), sort_keys=True): kind for config, kind in zip(configs, kinds) if kind}
    builder_hook = functools.partial(broken_build, plan)
    builder = LocalBuilder(2, builder_hook)
    try:
        with Measurer(task, builder=builder, timeout=3.0) as measurer:
            results = measurer.measure(configs)
            after = measurer.measure(configs[-1:])
    finally:
        builder.close()
    errors = [result.error for result in results]
    assert "SIGSEGV" in errors[0] and errors[0].startswith("run: crashed")
    assert "SIGSEGV" in errors[1] and errors[1].startswith("build: crashed")
    assert errors[2].startswith("run: timeout")
    assert errors[3] == "build: ValueError: a template bug"
    assert errors[4].startswith("wrong result: output 0 differs")
    assert errors[5] is None and results[5].seconds > 0
    assert all(result.seconds is None for result in results[:5])
    assert after[0].error is None and after[0].seconds > 0


def test_wasm_candidates_run_in_wasmtime_and_compute_what_native_ones_do():
    task = small_conv_task("wasm")
    configs = list(task.space.valid_configs())[:2]
    with Measurer(task, workers=2) as measurer:
        results = measurer.measure(configs)
        wasm_outputs = measurer.reference()
    assert all(result.error is None and result.seconds > 0 for result in results)
    # the same probe inputs through the native runner: the wasm binder really ran the kernel
    native = small_conv_task("llvm")
    with Measurer(native, workers=1) as measurer:
        (native_outputs,) = measurer.reference()
    (wasm_output,) = wasm_outputs
    assert wasm_output.shape == native_outputs.shape and not np.isnan(wasm_output).any()
    np.testing.assert_allclose(wasm_output, native_outputs, rtol=1e-4, atol=1e-5)


def test_mismatch_tolerates_summation_order_and_names_the_first_difference():
    expected = RNG.standard_normal((4, 5)).astype("float32") * 100
    assert mismatch([expected * (1 + 1e-6)], [expected]) is None
    wrong = expected.copy()
    wrong[2, 3] += 1
    assert "at [2, 3]" in mismatch([wrong], [expected])
    nan = np.full_like(expected, np.nan)
    assert mismatch([nan], [expected]) is not None


def test_a_cross_target_candidate_says_where_to_run_it():
    from compiler.target import Target
    from compiler.tune.measure import time_candidate

    built = Built({}, Target.parse("llvm -mtriple=aarch64-linux-gnu"), "candidate", b"")
    seconds, error = time_candidate(built)
    assert seconds is None and "cannot run on this machine" in error


def test_a_gpu_kind_is_measured_through_its_backend_or_says_it_has_none():
    from compiler.backends import BACKENDS
    from compiler.target import GPU_KINDS, Target
    from compiler.tune.measure import time_candidate

    for kind in GPU_KINDS:
        seconds, error = time_candidate(Built({}, Target.parse(kind), "candidate", b""))
        assert seconds is None and error.startswith("run: ")
        if kind not in BACKENDS:
            assert f"target {kind!r} has no backend" in error


def test_probe_arrays_are_seeded_aligned_and_prefill_outputs():
    from compiler.runtime import ArgSpec
    from compiler.tune.measure import probe_arrays

    specs = [ArgSpec("x", (3, 5), "float32"), ArgSpec("index", (4,), "int64"), ArgSpec("y", (), "float32")]
    first, again = probe_arrays(specs, 1, seed=3), probe_arrays(specs, 1, seed=3)
    assert all(array.ctypes.data % 64 == 0 for array in first)
    np.testing.assert_array_equal(first[0], again[0])
    assert first[0].std() > 0.5 and not first[1].any() and np.isnan(first[2])


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_gpu_candidates_are_timed_through_their_backends_runtime(kind):
    """PoCL and lavapipe run the GPU templates' configs (num_thread, tiles) and their outputs are checked too."""
    task = small_conv_task(kind)
    assert "num_thread" in task.space.knobs
    configs = [config for config in task.space.valid_configs() if config != task.space.fallback][:2]
    with Measurer(task, workers=2, timeout=60.0) as measurer:
        results = measurer.measure(configs)
    assert measurer.default.error is None and measurer.default.seconds > 0
    assert all(result.error is None and result.seconds > 0 for result in results), results


def test_a_task_whose_fallback_fails_is_recorded_as_failed_not_fatal(tmp_path):
    from compiler.tune.records import RecordLog, read_records

    task = small_conv_task()
    configs = list(task.space.valid_configs())[:2]
    plan = {json.dumps(task.space.fallback.to_json(), sort_keys=True): "build error"}
    builder = LocalBuilder(1, functools.partial(broken_build, plan))
    try:
        with RecordLog(tmp_path / "log.jsonl") as log, Measurer(task, builder=builder, records=log) as measurer:
            results = measurer.measure(configs)
    finally:
        builder.close()
    assert all(result.seconds is None and "no reference" in result.error for result in results)
    assert "a template bug" in results[0].error
    assert [record["error"] for record in read_records(tmp_path / "log.jsonl")] == [r.error for r in results]
