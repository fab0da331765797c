"""eliminate_dead: only nodes and params that reach a graph output survive; inputs stay as the interface."""

import numpy as np

from compiler.graph.ir import Graph, TensorType
from compiler.passes.eliminate_dead import eliminate_dead


def test_dead_branch_and_its_params_go(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3), "float32"))
        unused = graph.add_input("unused", TensorType((1,), "float32"))
        graph.add_param("orphan", np.zeros(3, np.float32))
        (dead,) = graph.add_node("Mul", [x, graph.add_param("scale", np.full(3, 2, np.float32))])
        graph.add_node("Exp", [dead])
        graph.add_node("Neg", [unused])
        graph.outputs = graph.add_node("Relu", [x])
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 3), "float32"))
        graph.add_input("unused", TensorType((1,), "float32"))
        graph.outputs = graph.add_node("Relu", [x])
        return graph

    graph = before()
    text = str(graph)
    pruned = eliminate_dead(graph)
    assert str(graph) == text, "the pass changed its input graph"
    assert_same_structure(pruned, expected())
    assert_same_results(graph, pruned)


def test_node_with_one_live_output_stays_whole(assert_same_structure):
    def build(with_dead_tail: bool):
        graph = Graph()
        x = graph.add_input("x", TensorType((4, 6), "float32"))
        first, second = graph.add_node("Split", [x], {"axis": 1, "num_outputs": 2})
        if with_dead_tail:
            graph.add_node("Exp", [second])
        graph.outputs = graph.add_node("Relu", [first])
        return graph

    assert_same_structure(eliminate_dead(build(True)), build(False))


def test_param_that_is_an_output_is_kept():
    graph = Graph()
    constant = graph.add_param("constant", np.arange(3, dtype=np.int64))
    graph.add_param("dropped", np.arange(3, dtype=np.int64))
    graph.outputs = [constant]
    pruned = eliminate_dead(graph)
    pruned.verify()
    assert list(pruned.params) == [constant]
