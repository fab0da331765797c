"""compile_model end to end: every zoo model, compiled for the host and for wasm, matches onnxruntime;
the `run` entry calls one kernel per fused group, repeated groups share a kernel, tuning records reach
the schedules, and wrong inputs or targets are clear errors."""

import json
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from compiler import zoo
from compiler.build import compile_model, group_key
from compiler.compute import group_to_te
from compiler.errors import ShapeError, TargetError
from compiler.frontend.onnx import load_onnx
from compiler.passes.pipeline import optimize
from compiler.schedules.cpu import schedule_group
from compiler.schedules.space import TuningWarning
from compiler.target import Target
from compiler.tir.lower import lower
from compiler.tir.printer import format_func
from compiler.tune.task import task_of
from tests.model_checks import assert_close_in_range

SLOW_MODELS = ("mobilenet_v2", "resnet18")


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)


@pytest.mark.parametrize("target", ["llvm", "wasm"])
@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_MODELS else name for name in zoo.MODELS]
)
def test_zoo_model_matches_onnxruntime(name, target):
    model = zoo.build_model(name)
    module = compile_model(model, target=target)
    feeds = zoo.sample_input(name)
    results = module.run(feeds)
    expected = _onnxruntime(model, feeds)
    assert [spec.name for spec in module.outputs] == [output.name for output in model.graph.output]
    for (output, actual), wanted in zip(results.items(), expected):
        assert_close_in_range(actual, wanted, err_msg=f"{name} {target} {output}")
    assert module.manifest["memory"]["arena_bytes"] <= module.manifest["memory"]["intermediate_bytes"]


def test_public_api_is_exported():
    assert compiler.compile_model is compile_model
    assert compiler.load_module is not None and compiler.Target.parse("wasm").kind == "wasm"


@pytest.mark.slow
def test_repeated_blocks_share_one_kernel_and_run_calls_every_group():
    module = compile_model(zoo.build_model("mobilenet_v2"), target="llvm")
    calls, kernels = module.manifest["calls"], module.manifest["kernels"]
    assert len(kernels) < len(calls)
    assert sum(len(kernel["groups"]) for kernel in kernels) == len(calls)
    run = re.search(r"define [^@]*@run\(.*?\n}\n", module.source("ll"), re.S).group(0)
    called = re.findall(r"call void @(kernel_\d+)\(", run)
    # one call per fused group, in order: the model runs without any loop outside the generated code
    assert called == [call["kernel"] for call in calls]


def test_group_key_is_equal_for_equal_groups_only():
    fused = optimize(load_onnx(zoo.build_model("mlp")))
    keys = [group_key(node) for node in fused.nodes]
    # the two hidden layers have equal shapes (512x512 after the first) but different inputs
    assert keys[0] != keys[1] != keys[2]
    assert group_key(fused.nodes[1]) == group_key(optimize(load_onnx(zoo.build_model("mlp"))).nodes[1])


def test_tuning_records_choose_the_schedule_knobs(tmp_path):
    model = zoo.build_model("mlp")
    target = compiler.Target.parse("llvm")
    fused = optimize(load_onnx(model), target=target)
    task = task_of(fused.nodes[0], target)
    assert task.template == "dense" and task.ops[0] == "Gemm"
    # the dense template's column tile at 4: 512 output columns become 128 parallel tiles
    (column_tile,) = [name for name in task.space.knobs if "tile_n" in name]
    fastest, slower = {column_tile: 4}, {column_tile: 32}
    records = tmp_path / "records.jsonl"
    task = task.to_json()
    wasm = task_of(fused.nodes[0], Target.parse("wasm")).to_json()
    lines = [
        {"task": task, "config": fastest, "seconds": 0.001, "timestamp": 1, "version": 1},
        {"task": task, "config": slower, "seconds": 0.002, "timestamp": 2, "version": 1},
        {"task": task, "config": {column_tile: 2}, "seconds": None, "error": "timeout", "version": 1},
        {"task": wasm, "config": {column_tile: 2}, "seconds": 0.0, "version": 1},
    ]
    records.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    default = compile_model(model, target=target)
    tuned = compile_model(model, target=target, tuning_records=records)
    first_default, first_tuned = (module.source("tir").split("\n\n")[0] for module in (default, tuned))
    assert ", 0, 128) parallel" in first_tuned and ", 0, 128) parallel" not in first_default
    group = group_to_te(fused.nodes[0])
    direct = lower(schedule_group(group, target, fastest), [*group.inputs, *group.outputs], "kernel_0")
    assert first_tuned == format_func(direct)
    assert tuned.manifest["kernels"][0]["config"] == fastest
    assert tuned.manifest["kernels"][1]["config"] is None
    assert tuned.manifest["content_hash"] != default.manifest["content_hash"]
    feeds = zoo.sample_input("mlp")
    np.testing.assert_allclose(tuned.run(feeds)["output"], _onnxruntime(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_a_record_that_no_longer_fits_its_template_falls_back(tmp_path):
    """A knob the template no longer has (the dense template's old `columns_outer`) or a tile outside the space:
    a warning naming it, and the default kernel."""
    model = zoo.build_model("mlp")
    target = compiler.Target.parse("llvm")
    task = task_of(optimize(load_onnx(model), target=target).nodes[0], target).to_json()
    default = compile_model(model, target=target).source("tir")
    records = tmp_path / "records.jsonl"
    for config, problem in (({"columns_outer": 0}, "no knob 'columns_outer'"), ({"split_k_tile_n": 7}, "outside")):
        records.write_text(json.dumps({"task": task, "config": config, "seconds": 0.001}) + "\n")
        with pytest.warns(TuningWarning, match=problem):
            tuned = compile_model(model, target=target, tuning_records=records)
        assert tuned.manifest["kernels"][0]["config"] is None
        assert tuned.source("tir") == default


def test_malformed_tuning_records_are_reported(tmp_path):
    records = tmp_path / "records.jsonl"
    records.write_text('{"task": {"op": "Gemm"}}\n')
    with pytest.raises(compiler.TesselError, match="line 1 is not a record"):
        compile_model(zoo.build_model("mlp"), target="llvm", tuning_records=records)


def test_progress_is_reported_from_start_to_end():
    steps = []
    compile_model(zoo.build_model("mlp"), target="wasm", progress=lambda step, fraction: steps.append((step, fraction)))
    fractions = [fraction for _, fraction in steps]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    assert any(step.startswith("lowering") for step, _ in steps) and any("linking" in step for step, _ in steps)


@pytest.fixture(scope="module")
def mlp_wasm():
    return compile_model(zoo.build_model("mlp"), target="wasm")


def test_wrong_input_name_shape_or_dtype_is_a_clear_error(mlp_wasm):
    good = zoo.sample_input("mlp")["input"]
    with pytest.raises(ShapeError, match="unknown input 'image'; the model's inputs are input"):
        mlp_wasm.run({"image": good})
    with pytest.raises(ShapeError, match=r"missing input 'input'"):
        mlp_wasm.run({})
    with pytest.raises(ShapeError, match=r"shape \(2, 784\), the model takes \(1, 784\)"):
        mlp_wasm.run({"input": np.zeros((2, 784), np.float32)})
    with pytest.raises(ShapeError, match="dtype float64, the model takes float32"):
        mlp_wasm.run({"input": good.astype(np.float64)})
    with pytest.raises(ShapeError, match="must be a numpy array"):
        mlp_wasm.run({"input": good.tolist()})


def test_benchmark_reports_milliseconds(mlp_wasm):
    timing = mlp_wasm.benchmark(repeat=3)
    assert set(timing) == {"median_ms", "min_ms", "max_ms"}
    assert 0 < timing["min_ms"] <= timing["median_ms"] <= timing["max_ms"]


def test_unknown_target_lists_the_valid_ones():
    with pytest.raises(TargetError, match=r"unknown target 'cuda-ish'.*wasm"):
        compile_model(zoo.build_model("mlp"), target="cuda-ish")


def test_cross_module_exports_but_does_not_run(tmp_path):
    module = compile_model(zoo.build_model("mlp"), target="llvm -mtriple=aarch64-linux-gnu")
    with pytest.raises(TargetError, match="cross-compiled for aarch64"):
        module.run(zoo.sample_input("mlp"))
    assert (module.export(tmp_path / "mlp") / "model.so").read_bytes()[:4] == b"\x7fELF"


def test_outputs_that_no_kernel_writes_are_copied():
    """A graph output that is an input or a constant, and a value listed twice, come back as copies."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3]) for name in ("y", "x", "c", "y2")]
    constant = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "c")
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["y"], ["y2"])]
    graph = helper.make_graph(nodes, "aliases", [x], outputs, [constant])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": np.array([[-1, 2, -3], [4, -5, 6]], np.float32)}
    expected = _onnxruntime(model, feeds)
    for target in ("llvm", "wasm"):
        results = compile_model(model, target=target).run(feeds)
        assert list(results) == ["y", "x", "c", "y2"]
        for actual, wanted in zip(results.values(), expected):
            np.testing.assert_array_equal(actual, wanted)


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_conv_chain_with_silu_is_fused_and_matches_onnxruntime(target):
    """Two convs with SiLU (x * sigmoid(x)) after each, as EfficientNet and YOLO write them: each SiLU joins its
    conv's kernel, in the blocked layout, and the outputs match onnxruntime's."""
    rng = np.random.default_rng(3)
    weights = [
        numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)
        for name, shape in (("w1", (16, 3, 3, 3)), ("w2", (16, 16, 3, 3)))
    ]
    nodes = []
    x = "x"
    for number, weight in enumerate(("w1", "w2")):
        conv, gate, out = f"conv{number}", f"gate{number}", f"silu{number}"
        nodes += [
            helper.make_node("Conv", [x, weight], [conv], pads=[1, 1, 1, 1]),
            helper.make_node("Sigmoid", [conv], [gate]),
            helper.make_node("Mul", [conv, gate], [out]),
        ]
        x = out
    graph = helper.make_graph(
        nodes,
        "silu_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 16, 12, 12])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    module = compile_model(model, target=target)
    groups = [call["group"] for call in module.manifest["calls"]]
    assert sum("sigmoid_mul" in group for group in groups) == 2, groups
    feeds = {"x": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)}
    (actual,) = module.run(feeds).values()
    np.testing.assert_allclose(actual, _onnxruntime(model, feeds)[0], rtol=1e-4, atol=1e-5)
