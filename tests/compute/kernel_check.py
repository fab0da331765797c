"""Test helper for the compute tests: fuse a graph, build each group as one kernel (through the CPU
schedules, or a plain schedule that only inlines injective stages), run the kernels in order on numpy
arrays and compare with the reference executor."""

from __future__ import annotations

import numpy as np

from compiler import te
from compiler.build import build
from compiler.compute import group_to_te
from compiler.graph.ir import Graph, Node
from compiler.graph.reference import run_reference
from compiler.graph.registry import Pattern, get_op
from compiler.passes.fuse_ops import fuse_ops
from compiler.schedules.cpu import schedule_group
from compiler.target import Target
from compiler.te.schedule import Stage


def plain_schedule(group) -> te.Schedule:
    """Inline every non-output stage that has no reduction; everything else gets its own loops."""
    schedule = te.create_schedule([tensor.op for tensor in group.outputs])
    for tensor in group.inputs:
        # a kernel takes every group input, even one only its shape was needed from
        if tensor.op not in schedule.stage_map:
            schedule.stage_map[tensor.op] = Stage(schedule, tensor.op)
            schedule.stages.insert(0, schedule.stage_map[tensor.op])
    outputs = {id(tensor.op) for tensor in group.outputs}
    for tensor in group.stages:
        if id(tensor.op) not in outputs and not tensor.op.reduce_axis:
            schedule[tensor].compute_inline()
    return schedule


def schedule_for(group, target: str) -> te.Schedule:
    return schedule_group(group, Target.parse(target))


def run_compiled(graph: Graph, inputs: dict[str, np.ndarray], target: str) -> dict:
    """Outputs of `graph` by name, each fused group run as one compiled kernel."""
    fused = fuse_ops(graph)
    env = {v: inputs[v.name] for v in fused.inputs}
    env.update(fused.params)
    for node in fused.nodes:
        group = group_to_te(node)
        kernel = build(schedule_for(group, target), group.inputs + group.outputs, target=target, name=node.name)
        arguments = [np.array(env[v], copy=True, order="C") for v in node.inputs]
        results = [np.zeros(v.type.shape, v.type.dtype) for v in node.outputs]
        kernel(*arguments, *results)
        env.update(zip(node.outputs, results, strict=True))
    return {v.name: env[v] for v in fused.outputs}


def check(graph: Graph, inputs: dict[str, np.ndarray], targets=("llvm", "wasm"), rtol=1e-5, atol=1e-6) -> None:
    """Every output of `graph`, compiled for each target, matches the reference executor."""
    expected = run_reference(graph, inputs)
    for target in targets:
        actual = run_compiled(graph, inputs, target)
        for name, value in expected.items():
            assert actual[name].dtype == value.dtype, f"{target}: {name} dtype {actual[name].dtype} != {value.dtype}"
            np.testing.assert_allclose(
                actual[name], value, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"{target}: output {name}"
            )


def as_one_group(graph: Graph) -> Node:
    """The whole of `graph` as one fused node, so many ops compile into a single kernel (fewer builds)."""
    pattern = max(get_op(node.op).pattern_of(node.attrs) for node in graph.nodes)
    anchor = next(node.op for node in graph.nodes if get_op(node.op).pattern_of(node.attrs) == pattern)
    attrs = {"body": graph, "pattern": pattern.name, "anchor": anchor if pattern >= Pattern.REDUCE else ""}
    return Node("fused", list(graph.inputs), list(graph.outputs), attrs, "fused_" + graph.name)


def check_one_kernel(graph: Graph, inputs: dict, targets=("llvm", "wasm"), rtol=1e-5, atol=1e-6) -> None:
    """Every output of `graph` built as ONE kernel for each target matches the reference executor."""
    expected = run_reference(graph, inputs)
    node = as_one_group(graph)
    for target in targets:
        group = group_to_te(node)
        kernel = build(schedule_for(group, target), group.inputs + group.outputs, target=target, name="checked")
        results = [np.zeros(v.type.shape, v.type.dtype) for v in graph.outputs]
        kernel(*[np.array(inputs[v.name], copy=True, order="C") for v in graph.inputs], *results)
        for value, actual in zip(graph.outputs, results, strict=True):
            wanted = expected[value.name]
            assert actual.dtype == wanted.dtype
            np.testing.assert_allclose(
                actual, wanted, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"{target}: {value.name}"
            )
