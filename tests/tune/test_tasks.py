"""Tuning tasks (compiler/tune/task.py): keys that tell apart every workload a record could be wrong for (strides,
attributes, the fused epilogue, the target and its features, the space version), and a model's weighted tasks."""

import json
from collections import Counter

import numpy as np
import pytest

from compiler import zoo
from compiler.build import compile_model, group_key
from compiler.frontend.onnx import load_onnx
from compiler.graph.ir import Graph, TensorType
from compiler.passes.pipeline import optimize
from compiler.schedules.cpu import SPACE_VERSION
from compiler.schedules.space import TuningWarning
from compiler.target import Target
from compiler.tune.task import extract_tasks, task_of

RNG = np.random.default_rng(0)


def conv(attrs=None, epilogue=(), x_shape=(1, 8, 16, 16), w_shape=(8, 8, 3, 3), dtype="float32") -> Graph:
    graph = Graph()
    x = graph.add_input("x", TensorType(x_shape, dtype))
    (y,) = graph.add_node("Conv", [x, graph.add_param("w", RNG.standard_normal(w_shape).astype(dtype))], attrs or {})
    for op in epilogue:
        (y,) = graph.add_node(op, [y])
    graph.outputs = [y]
    return graph


def key(graph: Graph, target="llvm") -> str:
    (node,) = optimize(graph, target=Target.parse(target)).nodes
    return task_of(node, Target.parse(target)).key


def test_convs_of_equal_shapes_and_other_strides_are_other_tasks():
    """The old task (anchor op, input shapes, dtype, target) was the same for both: one record served two kernels."""
    one, two = (
        optimize(conv({"strides": strides, "pads": [1, 1, 1, 1]}), target=Target.parse("llvm"))
        for strides in ([1, 1], [2, 2])
    )
    assert [v.type.shape for v in one.nodes[0].inputs] == [v.type.shape for v in two.nodes[0].inputs]
    tasks = [task_of(graph.nodes[0], Target.parse("llvm")) for graph in (one, two)]
    assert tasks[0].template == tasks[1].template and tasks[0].key != tasks[1].key


@pytest.mark.parametrize(
    "other",
    [
        {"pads": [0, 0, 0, 0]},
        {"pads": [1, 1, 1, 1], "dilations": [2, 2]},
        {"pads": [1, 1, 1, 1], "group": 2, "w_shape": (8, 4, 3, 3)},
    ],
)
def test_attributes_are_part_of_the_key(other):
    other = dict(other)
    w_shape = other.pop("w_shape", (8, 8, 3, 3))
    assert key(conv({"pads": [1, 1, 1, 1]})) != key(conv(other, w_shape=w_shape))


def test_the_fused_epilogue_is_part_of_the_key():
    keys = {key(conv({"pads": [1, 1, 1, 1]}, epilogue)) for epilogue in ((), ("Relu",), ("Sigmoid",), ("Relu", "Neg"))}
    assert len(keys) == 4


def test_the_target_and_its_features_are_part_of_the_key():
    graph = conv({"pads": [1, 1, 1, 1]})
    host = Target.parse("llvm")
    # four feature sets whatever this host has: the host's own equals the one of them it matches (+avx512f on an
    # AVX-512 machine, -avx512f elsewhere)
    targets = ("llvm", "wasm", "llvm -mattr=+avx512f", "llvm -mattr=+avx512f,-fma", "llvm -mattr=-avx512f")
    keys = {target: key(graph, target) for target in targets}
    assert len(set(keys.values())) == 4
    assert keys["llvm"] == keys["llvm -mattr=+avx512f" if host.vector_bytes == 64 else "llvm -mattr=-avx512f"]
    # the same machine spelled otherwise is the same target
    assert key(graph, f"llvm -mcpu={host.cpu}") == keys["llvm"]
    assert json.loads(keys["wasm"])["target"] == {
        "kind": "wasm",
        "triple": "wasm32-unknown-unknown",
        "cpu": "generic",
        "features": ["simd128"],
    }


def test_equal_workloads_share_a_key_whatever_the_weights():
    """Only the computation decides a task: parameter values do not, the space version does."""
    first, second = key(conv({"pads": [1, 1, 1, 1]})), key(conv({"pads": [1, 1, 1, 1]}))
    assert first == second
    task = json.loads(first)
    assert task["space_version"] == SPACE_VERSION and task["template"]
    assert [member["op"] for member in task["workload"]["ops"]] == ["Conv"]
    assert task["workload"]["ops"][0]["attrs"]["pads"] == [1, 1, 1, 1]


def test_a_record_tunes_only_its_own_stride(tmp_path):
    """One model with two convs of equal input shapes, stride 1 and stride 2: a record for the stride-1 task is
    applied to that kernel alone."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 16, 16), "float32"))
    outputs = []
    for strides in ([1, 1], [2, 2]):
        weights = graph.add_param(f"w{strides[0]}", RNG.standard_normal((8, 8, 3, 3)).astype(np.float32))
        outputs += graph.add_node("Conv", [x, weights], {"strides": strides, "pads": [1, 1, 1, 1]})
    graph.outputs = outputs
    fused = optimize(graph, target=Target.parse("llvm"))
    tasks = [task_of(node, Target.parse("llvm")) for node in fused.nodes]
    strided = [task for task in tasks if task.workload["ops"][0]["attrs"]["strides"] == [1, 1]]
    (task,) = strided
    config = next(config for config in task.space.valid_configs() if config != task.space.fallback).to_json()
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps({"task": task.to_json(), "config": config, "seconds": 0.001}) + "\n")
    module = compile_model(graph, target="llvm", tuning_records=records)
    configs = [kernel["config"] for kernel in module.manifest["kernels"] for _ in kernel["groups"]]
    assert configs == [config if item is task else None for item in tasks]
    feeds = {"x": RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)}
    expected = compile_model(graph, target="llvm").run(feeds)
    for name, value in module.run(feeds).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-5)


def test_records_of_another_space_version_or_the_old_form_do_not_apply(tmp_path):
    graph = conv({"pads": [1, 1, 1, 1]})
    (node,) = optimize(graph, target=Target.parse("llvm")).nodes
    task = task_of(node, Target.parse("llvm"))
    config = next(config for config in task.space.valid_configs() if config != task.space.fallback).to_json()
    old_form = {"op": "Conv", "shapes": [[1, 8, 16, 16], [8, 8, 3, 3]], "dtype": "float32", "target": "llvm"}
    records = tmp_path / "records.jsonl"
    lines = [{"task": {**task.to_json(), "space_version": 0}, "config": config, "seconds": 0.001}]
    lines.append({"task": old_form, "config": config, "seconds": 0.001})
    records.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.warns(TuningWarning, match="2 tuning record"):
        module = compile_model(graph, target="llvm", tuning_records=records)
    assert module.manifest["kernels"][0]["config"] is None


def test_extract_tasks_weighs_each_task_by_its_groups():
    model = zoo.build_model("resnet18")
    tasks = extract_tasks(model, "llvm")
    fused = optimize(load_onnx(model), target=Target.parse("llvm"))
    # one target: a task for each distinct kernel, weighted by the groups that run it
    assert Counter({task.key: task.weight for task in tasks}.values()) == Counter(
        Counter(group_key(node) for node in fused.nodes).values()
    )
    assert sum(task.weight for task in tasks) == len(fused.nodes)
    assert len({task.key for task in tasks}) == len(tasks)
    assert max(task.weight for task in tasks) > 1
    assert {task.template for task in tasks} >= {"conv2d_nchwc", "dense", "pool_max"}
    assert all(task.space.size >= 1 and task.space.fallback.valid for task in tasks)
    # a path and an imported graph give the same tasks
    assert [task.key for task in extract_tasks(load_onnx(model), "llvm")] == [task.key for task in tasks]
