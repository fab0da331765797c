"""The order the importer reads nodes in (compiler/frontend/order.py): any acyclic graph is sorted, a sorted one keeps
its order exactly, and only a cycle or a value defined twice is refused, naming the nodes. Results are compared with
onnxruntime, which sorts graphs itself, and with the same model in file order."""

import random
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler import zoo
from compiler.errors import ModelError
from compiler.frontend import load_onnx
from compiler.frontend.order import node_order
from compiler.graph.reference import run_reference

RNG = np.random.default_rng(0)
# the models the onnx wheel ships: pytorch exports, small real models and the "light" model-zoo graphs
SHIPPED = Path(onnx.__file__).parent / "backend" / "test" / "data"


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "order", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _tensor(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _diamond() -> onnx.ModelProto:
    """x -> (a, b) -> c -> y, with a weight: two orders are valid between a and b."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="a"),
        helper.make_node("Sigmoid", ["x"], ["b"], name="b"),
        helper.make_node("Add", ["a", "b"], ["c"], name="c"),
        helper.make_node("Relu", ["c"], ["y"], name="y"),
    ]
    weight = numpy_helper.from_array(RNG.standard_normal((3, 3)).astype(np.float32), "w")
    return _model(nodes, [_tensor("x", [2, 3])], [_tensor("y", [2, 3])], [weight])


def _reordered(model: onnx.ModelProto, order) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.node[:]
    copy.graph.node.extend(model.graph.node[index] for index in order)
    return copy


def test_a_model_in_reverse_order_imports_and_matches_onnxruntime():
    model = _reordered(_diamond(), [3, 2, 1, 0])
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    expected = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    graph = load_onnx(model)
    # of the two ready nodes, b comes first in the file, so it is read first
    assert [node.name for node in graph.nodes] == ["b", "a", "c", "y"]
    np.testing.assert_allclose(run_reference(graph, {"x": x})["y"], expected[0], rtol=1e-6)


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [1, 0, 2, 3]])
def test_a_sorted_model_keeps_its_order_exactly(order):
    graph = load_onnx(_reordered(_diamond(), order))
    assert [node.name for node in graph.nodes] == [["a", "b", "c", "y"][index] for index in order]


def test_every_zoo_model_and_shipped_onnx_model_keeps_its_file_order():
    """What keeps generated code the same for every model that imported before the sort."""
    models = [zoo.build_model(name) for name in zoo.MODELS]
    models += [onnx.load(path) for path in sorted(SHIPPED.rglob("*.onnx"))]
    assert len(models) > 150
    unsorted = [model.graph.name for model in models if node_order(model.graph) != list(range(len(model.graph.node)))]
    assert unsorted == []


@pytest.mark.parametrize("name", ["resnet18", "bert_tiny"])
def test_a_shuffled_zoo_model_computes_what_the_model_in_file_order_does(name):
    model = zoo.build_model(name)
    order = list(range(len(model.graph.node)))
    random.Random(0).shuffle(order)
    shuffled = load_onnx(_reordered(model, order))
    graph = load_onnx(model)
    assert sorted(map(str, shuffled.nodes)) == sorted(map(str, graph.nodes))
    feeds = {
        value.name: RNG.integers(0, 2, value.type.shape).astype(value.type.dtype)
        if value.type.dtype.startswith("int")
        else RNG.standard_normal(value.type.shape).astype(value.type.dtype)
        for value in graph.inputs
    }
    got, expected = run_reference(shuffled, feeds), run_reference(graph, feeds)
    for output in expected:
        np.testing.assert_array_equal(got[output], expected[output])


def test_a_cycle_is_refused_naming_its_nodes_and_not_the_nodes_after_it():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="start"),
        helper.make_node("Add", ["r", "d"], ["s"], name="add"),
        helper.make_node("Neg", ["s"], ["n"], name="negate"),
        helper.make_node("Abs", ["n"], ["d"], name="absolute"),
        helper.make_node("Sigmoid", ["s"], ["y"], name="after"),
    ]
    model = _model(nodes, [_tensor("x", [2])], [_tensor("y", [2])])
    with pytest.raises(ModelError) as caught:
        load_onnx(model)
    message = str(caught.value)
    assert message.startswith(
        "the model's graph is not acyclic: 3 nodes form a cycle (node add (Add) makes 's', read by node negate (Neg), "
        "which makes 'n', read by node absolute (Abs), which makes 'd', read by node add (Add));"
    )
    assert "export the model again" in message
    assert "after" not in message and "start" not in message


def test_a_node_that_reads_its_own_output_is_a_cycle():
    nodes = [helper.make_node("Add", ["x", "s"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    with pytest.raises(ModelError, match=r"node Add_0 \(Add\) reads its own output \(node Add_0 \(Add\) makes 's'"):
        load_onnx(_model(nodes, [_tensor("x", [2])], [_tensor("y", [2])]))


def test_a_long_cycle_is_shown_by_its_ends():
    count = 40
    nodes = [helper.make_node("Add", ["x", f"v{(i + 1) % count}"], [f"v{i}"], name=f"n{i}") for i in range(count)]
    nodes.append(helper.make_node("Relu", ["v0"], ["y"]))
    with pytest.raises(
        ModelError,
        match=r"40 nodes form a cycle \(node n0 \(Add\) makes 'v0', read by node n39 .*"
        r"\.\.\. 28 more nodes \.\.\..*read by node n0 \(Add\)\)",
    ) as caught:
        load_onnx(_model(nodes, [_tensor("x", [2])], [_tensor("y", [2])]))
    assert "n20 " not in str(caught.value)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("node one (Relu)", "node two (Neg)"),
        ("initializer 'v'", "node two (Neg)"),
        ("graph input 'v'", "node two (Neg)"),
    ],
)
def test_a_value_defined_twice_names_both_definitions(first, second):
    nodes = [helper.make_node("Neg", ["x"], ["v"], name="two"), helper.make_node("Relu", ["v"], ["y"], name="three")]
    inputs, initializers = [_tensor("x", [2])], []
    if first.startswith("node"):
        nodes.insert(0, helper.make_node("Relu", ["x"], ["v"], name="one"))
    elif first.startswith("initializer"):
        initializers.append(numpy_helper.from_array(np.ones(2, np.float32), "v"))
    else:
        inputs.append(_tensor("v", [2]))
    model = _model(nodes, inputs, [_tensor("y", [2])], initializers)
    with pytest.raises(
        ModelError, match=rf"value 'v' is defined twice, by {re.escape(first)} and by {re.escape(second)}; .*: export"
    ):
        load_onnx(model)


def test_a_name_that_nothing_defines_is_named_as_before():
    model = _model([helper.make_node("Relu", ["nowhere"], ["y"], name="r")], [_tensor("x", [2])], [_tensor("y", [2])])
    with pytest.raises(ModelError, match=r"node r \(Relu\): it uses 'nowhere', which no node, input or initializer"):
        load_onnx(model)


def test_an_if_branch_that_reads_an_outer_value_comes_after_the_value_s_node():
    """Subgraphs read outer names without listing them as inputs; the sort counts those reads too. (Tessel does not
    import If yet, so this asks the sort alone.)"""
    branch = helper.make_graph([helper.make_node("Identity", ["late"], ["out"])], "branch", [], [_tensor("out", [2])])
    nodes = [
        helper.make_node("If", ["condition"], ["y"], then_branch=branch, else_branch=branch, name="if"),
        helper.make_node("Relu", ["x"], ["late"], name="late"),
    ]
    condition = helper.make_tensor_value_info("condition", TensorProto.BOOL, [])
    model = _model(nodes, [_tensor("x", [2]), condition], [_tensor("y", [2])])
    onnx.checker.check_model(_reordered(model, [1, 0]))
    assert node_order(model.graph) == [1, 0]
