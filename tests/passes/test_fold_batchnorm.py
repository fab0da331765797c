"""fold_batchnorm: inference BatchNormalization folds into Conv/Gemm/MatMul params, or becomes Mul + Add."""

import numpy as np
import pytest

from compiler.graph.ir import Graph, TensorType
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_batchnorm import fold_batchnorm

RNG = np.random.default_rng(3)
CHANNELS = 4


def statistics(graph: Graph, channels: int = CHANNELS) -> list:
    """Scale, bias, mean and (positive) variance params for a BatchNormalization."""
    arrays = [RNG.standard_normal(channels) for _ in range(3)] + [RNG.uniform(0.5, 2.0, channels)]
    names = ("gamma", "beta", "mean", "variance")
    return [graph.add_param(name, array.astype(np.float32)) for name, array in zip(names, arrays)]


def conv_input(graph: Graph):
    return graph.add_input("x", TensorType((1, 3, 6, 6), "float32"))


def conv_weight(graph: Graph):
    return graph.add_param("w", RNG.standard_normal((CHANNELS, 3, 3, 3)).astype(np.float32))


@pytest.mark.parametrize("with_bias", [False, True])
def test_conv_then_batchnorm_folds_into_conv(with_bias, assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x, w = conv_input(graph), conv_weight(graph)
        bias = [graph.add_param("b", RNG.standard_normal(CHANNELS).astype(np.float32))] if with_bias else []
        (conv,) = graph.add_node("Conv", [x, w, *bias], {"pads": (1, 1, 1, 1)})
        graph.outputs = graph.add_node("BatchNormalization", [conv, *statistics(graph)], {"epsilon": 1e-3})
        return graph

    def expected():
        graph = Graph()
        x = conv_input(graph)
        w = graph.add_param("w_folded", np.zeros((CHANNELS, 3, 3, 3), np.float32))
        b = graph.add_param("b_folded", np.zeros(CHANNELS, np.float32))
        graph.outputs = graph.add_node("Conv", [x, w, b], {"pads": (1, 1, 1, 1)})
        return graph

    graph = before()
    text = str(graph)
    folded = eliminate_dead(fold_batchnorm(graph))
    assert str(graph) == text, "the pass changed its input graph"
    assert_same_structure(folded, expected())
    assert folded.outputs == graph.outputs
    assert_same_results(graph, folded, rtol=1e-5, atol=1e-5)


def test_conv_with_second_reader_keeps_its_output(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x, w = conv_input(graph), conv_weight(graph)
        (conv,) = graph.add_node("Conv", [x, w])
        (normalized,) = graph.add_node("BatchNormalization", [conv, *statistics(graph)])
        graph.outputs = [normalized, *graph.add_node("Relu", [conv])]
        return graph

    def expected():
        graph = Graph()
        x, w = conv_input(graph), conv_weight(graph)
        scale = graph.add_param("scale", np.zeros((CHANNELS, 1, 1), np.float32))
        shift = graph.add_param("shift", np.zeros((CHANNELS, 1, 1), np.float32))
        (conv,) = graph.add_node("Conv", [x, w])
        (scaled,) = graph.add_node("Mul", [conv, scale])
        graph.outputs = [*graph.add_node("Add", [scaled, shift]), *graph.add_node("Relu", [conv])]
        return graph

    graph = before()
    folded = eliminate_dead(fold_batchnorm(graph))
    assert_same_structure(folded, expected())
    assert_same_results(graph, folded, rtol=1e-5, atol=1e-5)


def test_conv_output_that_is_a_graph_output_is_not_folded_into():
    graph = Graph()
    x, w = conv_input(graph), conv_weight(graph)
    (conv,) = graph.add_node("Conv", [x, w])
    graph.outputs = [conv, *graph.add_node("BatchNormalization", [conv, *statistics(graph)])]
    assert [node.op for node in fold_batchnorm(graph).nodes] == ["Conv", "Mul", "Add"]


@pytest.mark.parametrize(
    "attrs", [{"transB": 1}, {"transB": 0}, {"transB": 1, "alpha": 0.5, "beta": 2.0}], ids=["transB", "plain", "scaled"]
)
def test_gemm_then_batchnorm_folds_into_gemm(attrs, assert_same_results):
    graph = Graph()
    x = graph.add_input("x", TensorType((5, 3), "float32"))
    shape = (CHANNELS, 3) if attrs["transB"] else (3, CHANNELS)
    weight = graph.add_param("w", RNG.standard_normal(shape).astype(np.float32))
    bias = graph.add_param("c", RNG.standard_normal(CHANNELS).astype(np.float32))
    (gemm,) = graph.add_node("Gemm", [x, weight, bias], attrs)
    graph.outputs = graph.add_node("BatchNormalization", [gemm, *statistics(graph)])
    folded = eliminate_dead(fold_batchnorm(graph))
    folded.verify()
    assert [node.op for node in folded.nodes] == ["Gemm"]
    assert len(folded.params) == 2
    assert_same_results(graph, folded, rtol=1e-5, atol=1e-5)


def test_matmul_then_batchnorm_gets_scaled_weight_and_a_bias(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((5, 3), "float32"))
        weight = graph.add_param("w", RNG.standard_normal((3, CHANNELS)).astype(np.float32))
        (product,) = graph.add_node("MatMul", [x, weight])
        graph.outputs = graph.add_node("BatchNormalization", [product, *statistics(graph)])
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((5, 3), "float32"))
        weight = graph.add_param("w", np.zeros((3, CHANNELS), np.float32))
        bias = graph.add_param("b", np.zeros(CHANNELS, np.float32))
        (product,) = graph.add_node("MatMul", [x, weight])
        graph.outputs = graph.add_node("Add", [product, bias])
        return graph

    graph = before()
    folded = eliminate_dead(fold_batchnorm(graph))
    assert_same_structure(folded, expected())
    assert_same_results(graph, folded, rtol=1e-5, atol=1e-5)


def test_standalone_batchnorm_becomes_scale_shift(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, CHANNELS, 3, 5), "float32"))
        (relu,) = graph.add_node("Relu", [x])
        graph.outputs = graph.add_node("BatchNormalization", [relu, *statistics(graph)])
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, CHANNELS, 3, 5), "float32"))
        scale = graph.add_param("scale", np.zeros((CHANNELS, 1, 1), np.float32))
        shift = graph.add_param("shift", np.zeros((CHANNELS, 1, 1), np.float32))
        (relu,) = graph.add_node("Relu", [x])
        (scaled,) = graph.add_node("Mul", [relu, scale])
        graph.outputs = graph.add_node("Add", [scaled, shift])
        return graph

    graph = before()
    folded = eliminate_dead(fold_batchnorm(graph))
    assert_same_structure(folded, expected())
    assert folded.outputs == graph.outputs
    assert_same_results(graph, folded, rtol=1e-5, atol=1e-5)


def test_batchnorm_with_runtime_statistics_stays():
    graph = Graph()
    x = graph.add_input("x", TensorType((2, CHANNELS), "float32"))
    mean = graph.add_input("mean", TensorType((CHANNELS,), "float32"))
    gamma, beta, _, variance = statistics(graph)
    graph.outputs = graph.add_node("BatchNormalization", [x, gamma, beta, mean, variance])
    assert [node.op for node in fold_batchnorm(graph).nodes] == ["BatchNormalization"]
