"""fold_constants: nodes that read only params become params; Shape of a static value folds; big growth does not."""

import numpy as np

from compiler.graph.ir import Graph, TensorType
from compiler.passes.fold_constants import GROWTH_LIMIT_ELEMENTS, fold_constants

RNG = np.random.default_rng(7)


def test_param_chain_folds_into_params(assert_same_structure, assert_same_results):
    weight = RNG.standard_normal((6, 4)).astype(np.float32)

    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 4), "float32"))
        w = graph.add_param("w", weight)
        (transposed,) = graph.add_node("Transpose", [w], {"perm": (1, 0)})
        (scaled,) = graph.add_node("Mul", [transposed, graph.add_param("two", np.float32(2.0))])
        graph.outputs = graph.add_node("MatMul", [x, scaled])
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 4), "float32"))
        graph.add_param("w", weight)
        graph.add_param("two", np.float32(2.0))
        graph.add_param("transpose", weight.T)
        scaled = graph.add_param("mul", weight.T * 2)
        graph.outputs = graph.add_node("MatMul", [x, scaled])
        return graph

    graph = before()
    text = str(graph)
    folded = fold_constants(graph)
    assert str(graph) == text, "the pass changed its input graph"
    assert_same_structure(folded, expected())
    np.testing.assert_array_equal(folded.params[folded.nodes[0].inputs[1]], weight.T * 2)
    assert_same_results(graph, folded)


def test_shape_of_static_value_folds():
    graph = Graph()
    x = graph.add_input("x", TensorType((2, 3, 5), "float32"))
    (relu,) = graph.add_node("Relu", [x])
    (shape,) = graph.add_node("Shape", [relu], {"start": -2})
    (size,) = graph.add_node("Size", [relu])
    graph.outputs = [relu, shape, size]
    folded = fold_constants(graph)
    folded.verify()
    assert [node.op for node in folded.nodes] == ["Relu"]
    np.testing.assert_array_equal(folded.params[shape], np.array([3, 5], dtype=np.int64))
    np.testing.assert_array_equal(folded.params[size], np.array(30, dtype=np.int64))


def test_growth_past_limit_is_not_folded():
    graph = Graph()
    one = graph.add_param("one", np.ones((1, 1), np.float32))
    (small,) = graph.add_node("Expand", [one], {"shape": (4, 8)})
    (large,) = graph.add_node("Expand", [one], {"shape": (GROWTH_LIMIT_ELEMENTS // 1024 + 1, 1024)})
    graph.outputs = [small, large]
    folded = fold_constants(graph)
    folded.verify()
    assert [node.outputs for node in folded.nodes] == [[large]]
    np.testing.assert_array_equal(folded.params[small], np.ones((4, 8), np.float32))


def test_shrinking_result_folds_whatever_its_size():
    graph = Graph()
    big = graph.add_param("big", np.arange(2 * GROWTH_LIMIT_ELEMENTS, dtype=np.float32).reshape(2, -1))
    graph.outputs = graph.add_node("ReduceSum", [big], {"axes": (0,)})
    folded = fold_constants(graph)
    assert folded.nodes == []
    expected = np.arange(2 * GROWTH_LIMIT_ELEMENTS, dtype=np.float32).reshape(2, -1).sum(axis=0, keepdims=True)
    np.testing.assert_allclose(folded.params[graph.outputs[0]], expected)


def test_nodes_reading_inputs_stay(assert_same_structure):
    def build():
        graph = Graph()
        x = graph.add_input("x", TensorType((3,), "float32"))
        (relu,) = graph.add_node("Relu", [x])
        graph.outputs = graph.add_node("Add", [relu, graph.add_param("bias", np.ones(3, np.float32))])
        return graph

    assert_same_structure(fold_constants(build()), build())
