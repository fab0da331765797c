"""Deep and long graphs (issue 14): a chain of thousands of nodes imports, optimizes and compiles without a
RecursionError, into groups no larger than fusion's bound, and computes what numpy computes."""

import numpy as np
import pytest
from onnx import helper

from compiler.build import compile_model
from compiler.frontend import load_onnx
from compiler.passes.fuse_ops import MAX_GROUP_OPS
from compiler.passes.pipeline import optimize
from compiler.target import Target


def _chain(ops: list[str]):
    nodes = [helper.make_node(op, [f"v{i}"], [f"v{i + 1}"], name=f"n{i}") for i, op in enumerate(ops)]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("v0", 1, [2, 8])],
        [helper.make_tensor_value_info(f"v{len(ops)}", 1, [2, 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("length", [300, 5000])
def test_a_long_chain_compiles_in_bounded_groups_and_matches_numpy(length):
    ops = ["Relu" if i % 3 == 0 else "Neg" if i % 3 == 1 else "Identity" for i in range(length)]
    model = _chain(ops)
    fused = optimize(load_onnx(model), target=Target.parse("llvm"))
    computing = [op for op in ops if op != "Identity"]
    sizes = [len(node.attrs["body"].nodes) for node in fused.nodes]
    assert sum(sizes) == len(computing) and max(sizes) == MAX_GROUP_OPS
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    expected = x
    for op in computing:
        expected = np.maximum(expected, 0) if op == "Relu" else -expected
    module = compile_model(model, target="llvm")
    np.testing.assert_array_equal(module.run({"v0": x})[f"v{length}"], expected)
    # the printers walk the same deep graphs and expressions
    assert str(fused).count(" = fused(") == len(fused.nodes)
    assert module.source("tir").count("kernel_0") >= 1


def test_simplify_removes_a_long_identity_chain_but_the_copy_into_the_output():
    graph = optimize(load_onnx(_chain(["Identity"] * 20000)), fuse=False)
    assert [node.op for node in graph.nodes] == ["Identity"] and graph.outputs[0].name == "v20000"
