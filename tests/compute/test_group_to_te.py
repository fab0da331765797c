"""group_to_te: a fused node's body becomes tensor expressions with one placeholder per group input, the
outputs in the node's order and the anchor found; the kernels built from it match the reference executor."""

import numpy as np
import onnx
import pytest
from kernel_check import check, plain_schedule
from onnx import TensorProto, helper, numpy_helper

from compiler.build import build
from compiler.compute import group_to_te
from compiler.errors import UnsupportedOpError
from compiler.frontend.onnx import load_onnx
from compiler.graph.ir import Graph, TensorType
from compiler.graph.reference import run_reference
from compiler.graph.registry import get_op
from compiler.passes.fuse_ops import fuse_ops

RNG = np.random.default_rng(3)


def _chain() -> Graph:
    """x -> Add(x, x) -> Relu -> (ReduceSum, and also an output), giving an injective group and a reduce group."""
    graph = Graph(name="chain")
    x = graph.add_input("x.in", TensorType((4, 8), "float32"))
    (doubled,) = graph.add_node("Add", [x, x])
    (rectified,) = graph.add_node("Relu", [doubled])
    (total,) = graph.add_node("ReduceSum", [rectified], {"axes": np.array([1]), "keepdims": 0})
    graph.outputs = [rectified, total]
    return graph


def test_a_value_read_twice_is_one_placeholder_named_after_it():
    fused = fuse_ops(_chain())
    group = group_to_te(fused.nodes[0])
    assert len(group.inputs) == 1
    assert group.inputs[0].name == "x_in"
    assert group.inputs[0].shape == (4, 8) and group.inputs[0].dtype == "float32"
    assert group.pattern == "BROADCAST" and group.anchor is None and group.anchor_op == ""


def test_outputs_follow_the_node_and_the_reduction_is_the_anchor():
    fused = fuse_ops(_chain())
    assert [node.attrs["pattern"] for node in fused.nodes] == ["BROADCAST", "REDUCE"]
    reduce_group = group_to_te(fused.nodes[1])
    assert [t.shape for t in reduce_group.outputs] == [v.type.shape for v in fused.nodes[1].outputs]
    assert reduce_group.anchor_op == "ReduceSum"
    assert reduce_group.anchor is reduce_group.outputs[0]
    assert reduce_group.anchor.op.tag == "reduce"
    assert reduce_group.stages[-1] is reduce_group.outputs[0]


def test_stages_list_every_compute_producers_first_with_tags():
    graph = Graph(name="tags")
    x = graph.add_input("x", TensorType((2, 3), "float32"))
    (moved,) = graph.add_node("Transpose", [x])
    (rectified,) = graph.add_node("Relu", [moved])
    (summed,) = graph.add_node("Add", [rectified, graph.add_input("b", TensorType((2,), "float32"))])
    graph.outputs = [summed]
    (node,) = fuse_ops(graph).nodes
    group = group_to_te(node)
    assert [tensor.op.tag for tensor in group.stages] == ["injective", "elemwise", "broadcast"]
    assert group.stages[-1] is group.outputs[0]


def test_a_group_with_several_outputs_builds_as_one_kernel():
    check(_chain(), {"x.in": RNG.standard_normal((4, 8)).astype(np.float32)})


def test_plain_schedule_builds_the_same_kernel_abi():
    graph = _chain()
    inputs = {"x.in": RNG.standard_normal((4, 8)).astype(np.float32)}
    expected = run_reference(graph, inputs)
    node = fuse_ops(graph).nodes[0]
    group = group_to_te(node)
    kernel = build(plain_schedule(group), group.inputs + group.outputs, target="llvm", name="plain")
    result = np.zeros((4, 8), np.float32)
    kernel(inputs["x.in"], result)
    np.testing.assert_allclose(result, expected[graph.outputs[0].name], rtol=1e-6)


def test_an_op_without_a_compute_is_reported_by_name(monkeypatch):
    monkeypatch.setattr(get_op("Relu"), "compute", None)
    fused = fuse_ops(_chain())
    with pytest.raises(UnsupportedOpError, match="op Relu has no kernel yet") as caught:
        group_to_te(fused.nodes[0])
    assert list(caught.value.ops) == ["Relu"]


def test_an_imported_onnx_model_with_params_runs_compiled():
    embedding = RNG.standard_normal((10, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
        helper.make_node("Sigmoid", ["rows"], ["gates"]),
        helper.make_node("Mul", ["rows", "gates"], ["y"]),
    ]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "embed",
            [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
            [numpy_helper.from_array(embedding, "table")],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    onnx.checker.check_model(model)
    graph = load_onnx(model)
    check(graph, {"ids": np.array([[0, 9, -1], [3, 3, -10]], np.int64)}, rtol=1e-4, atol=1e-5)


def test_input_names_that_clean_up_alike_stay_distinct():
    graph = Graph(name="names")
    first = graph.add_input("a.b", TensorType((3,), "float32"))
    second = graph.add_input("a_b", TensorType((3,), "float32"))
    (difference,) = graph.add_node("Sub", [first, second])
    graph.outputs = [difference]
    group = group_to_te(fuse_ops(graph).nodes[0])
    assert [tensor.name for tensor in group.inputs] == ["a_b", "a_b_"]
    check(graph, {"a.b": np.arange(3, dtype=np.float32), "a_b": np.ones(3, np.float32)}, targets=("llvm",))
