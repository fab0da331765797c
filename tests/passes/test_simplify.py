"""simplify: no-op nodes go, layout chains merge, and graph outputs keep their Values."""

import numpy as np
import pytest

from compiler.graph.ir import Graph, TensorType
from compiler.passes.simplify import simplify


def check(before, expected, assert_same_structure, assert_same_results):
    graph = before()
    text = str(graph)
    simplified = simplify(graph)
    assert str(graph) == text, "the pass changed its input graph"
    assert_same_structure(simplified, expected())
    assert [v.name for v in simplified.outputs] == [v.name for v in graph.outputs]
    assert_same_results(graph, simplified)
    return simplified


def test_identity_and_dropout_go(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3), "float32"))
        (relu,) = graph.add_node("Relu", [x])
        (same,) = graph.add_node("Identity", [relu])
        (dropped,) = graph.add_node("Dropout", [same], {"ratio": 0.5})
        graph.outputs = graph.add_node("Exp", [dropped])
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3), "float32"))
        (relu,) = graph.add_node("Relu", [x])
        graph.outputs = graph.add_node("Exp", [relu])
        return graph

    check(before, expected, assert_same_structure, assert_same_results)


def test_removed_output_producer_is_renamed_to_the_output(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3), "float32"))
        (relu,) = graph.add_node("Relu", [x])
        (exp,) = graph.add_node("Exp", [relu])
        graph.outputs = [*graph.add_node("Identity", [relu], output_names=["result"]), exp]
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3), "float32"))
        (result,) = graph.add_node("Relu", [x], output_names=["result"])
        graph.outputs = [result, *graph.add_node("Exp", [result])]
        return graph

    simplified = check(before, expected, assert_same_structure, assert_same_results)
    assert simplified.nodes[0].outputs[0].name == "result"


def test_identity_between_graph_boundaries_stays(assert_same_structure):
    def build():
        graph = Graph()
        x = graph.add_input("x", TensorType((2,), "float32"))
        graph.outputs = graph.add_node("Identity", [x])
        return graph

    assert_same_structure(simplify(build()), build())


def test_identity_between_two_graph_outputs_stays(assert_same_structure):
    def build():
        graph = Graph()
        x = graph.add_input("x", TensorType((2,), "float32"))
        (relu,) = graph.add_node("Relu", [x])
        graph.outputs = [relu, *graph.add_node("Identity", [relu])]
        return graph

    assert_same_structure(simplify(build()), build())


def test_dropout_with_a_used_mask_stays(assert_same_structure):
    def build():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3), "float32"))
        (relu,) = graph.add_node("Relu", [x])
        graph.outputs = graph.add_node("Dropout", [relu], {"_outputs": 2})
        return graph

    assert_same_structure(simplify(build()), build())


@pytest.mark.parametrize("first", ["Reshape", "Flatten"])
def test_reshape_chain_becomes_one_reshape(first, assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3, 4), "float32"))
        attrs = {"shape": (6, 4)} if first == "Reshape" else {"axis": 2}
        (flat,) = graph.add_node(first, [x], attrs)
        (again,) = graph.add_node("Reshape", [flat], {"shape": (4, -1)})
        graph.outputs = graph.add_node("Relu", [again])
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3, 4), "float32"))
        (again,) = graph.add_node("Reshape", [x], {"shape": (4, 6)})
        graph.outputs = graph.add_node("Relu", [again])
        return graph

    check(before, expected, assert_same_structure, assert_same_results)


def test_reshape_chain_back_to_the_input_shape_goes(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3, 4), "float32"))
        (flat,) = graph.add_node("Flatten", [x])
        (back,) = graph.add_node("Reshape", [flat], {"shape": (2, 3, 4)})
        (same,) = graph.add_node("Reshape", [back], {"shape": (0, 3, -1)})
        graph.outputs = graph.add_node("Neg", [same])
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3, 4), "float32"))
        graph.outputs = graph.add_node("Neg", [x])
        return graph

    check(before, expected, assert_same_structure, assert_same_results)


def test_shared_reshape_stays_for_its_other_reader(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 6), "float32"))
        (flat,) = graph.add_node("Reshape", [x], {"shape": (12,)})
        (square,) = graph.add_node("Reshape", [flat], {"shape": (3, 4)})
        graph.outputs = [*graph.add_node("Exp", [flat]), square]
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 6), "float32"))
        (flat,) = graph.add_node("Reshape", [x], {"shape": (12,)})
        (square,) = graph.add_node("Reshape", [x], {"shape": (3, 4)}, output_names=["square"])
        graph.outputs = [*graph.add_node("Exp", [flat]), square]
        return graph

    check(before, expected, assert_same_structure, assert_same_results)


def test_transpose_chain_composes(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3, 4), "float32"))
        (first,) = graph.add_node("Transpose", [x], {"perm": (1, 2, 0)})
        (second,) = graph.add_node("Transpose", [first], {"perm": (0, 2, 1)})
        graph.outputs = graph.add_node("Relu", [second])
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3, 4), "float32"))
        (both,) = graph.add_node("Transpose", [x], {"perm": (1, 0, 2)})
        graph.outputs = graph.add_node("Relu", [both])
        return graph

    check(before, expected, assert_same_structure, assert_same_results)


def test_inverse_transposes_vanish(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3, 4), "float32"))
        (relu,) = graph.add_node("Relu", [x])
        (first,) = graph.add_node("Transpose", [relu], {"perm": (2, 0, 1)})
        graph.outputs = graph.add_node("Transpose", [first], {"perm": (1, 2, 0)})
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3, 4), "float32"))
        graph.outputs = graph.add_node("Relu", [x])
        return graph

    check(before, expected, assert_same_structure, assert_same_results)


def test_neutral_arithmetic_goes(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3), "float32"))
        (a,) = graph.add_node("Mul", [graph.add_param("ones", np.ones(3, np.float32)), x])
        (b,) = graph.add_node("Add", [a, graph.add_param("zeros", np.zeros((1, 3), np.float32))])
        (c,) = graph.add_node("Sub", [b, graph.add_param("zero", np.float32(0))])
        (d,) = graph.add_node("Div", [c, graph.add_param("one", np.float32(1))])
        graph.outputs = graph.add_node("Sigmoid", [d])
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3), "float32"))
        for name, array in [("ones", np.ones(3)), ("zeros", np.zeros((1, 3))), ("zero", 0), ("one", 1)]:
            graph.add_param(name, np.asarray(array, np.float32))
        graph.outputs = graph.add_node("Sigmoid", [x])
        return graph

    check(before, expected, assert_same_structure, assert_same_results)


def test_arithmetic_that_changes_something_stays(assert_same_structure, assert_same_results):
    def build():
        graph = Graph()
        x = graph.add_input("x", TensorType((3,), "float32"))
        (widened,) = graph.add_node("Mul", [x, graph.add_param("ones", np.ones((2, 3), np.float32))])
        (shifted,) = graph.add_node("Add", [widened, graph.add_param("bias", np.full(3, 0.5, np.float32))])
        graph.outputs = graph.add_node("Sub", [graph.add_param("zero", np.float32(0)), shifted])
        return graph

    check(build, build, assert_same_structure, assert_same_results)


def test_square_becomes_a_multiply(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3), "float32"))
        (centred,) = graph.add_node("Sub", [x, graph.add_param("mean", np.full(3, 0.25, np.float32))])
        (square,) = graph.add_node("Pow", [centred, graph.add_param("two", np.float32(2))])
        graph.outputs = graph.add_node("ReduceMean", [square], {"axes": [1], "keepdims": 1})
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3), "float32"))
        (centred,) = graph.add_node("Sub", [x, graph.add_param("mean", np.full(3, 0.25, np.float32))])
        graph.add_param("two", np.float32(2))
        (square,) = graph.add_node("Mul", [centred, centred])
        graph.outputs = graph.add_node("ReduceMean", [square], {"axes": [1], "keepdims": 1})
        return graph

    check(before, expected, assert_same_structure, assert_same_results)


def test_powers_that_are_not_a_plain_square_stay(assert_same_structure, assert_same_results):
    def build():
        graph = Graph()
        x = graph.add_input("x", TensorType((3,), "float32"))
        (cube,) = graph.add_node("Pow", [x, graph.add_param("three", np.float32(3))])
        # an exponent of 2s that broadcasts the base to (2, 3) is not x * x
        (wide,) = graph.add_node("Pow", [cube, graph.add_param("twos", np.full((2, 3), 2, np.float32))])
        n = graph.add_input("n", TensorType((3,), "int32"))
        (integral,) = graph.add_node("Pow", [n, graph.add_param("int_two", np.int32(2))])
        graph.outputs = [wide, integral]
        return graph

    check(build, build, assert_same_structure, assert_same_results)
