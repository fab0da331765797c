"""The reference executor on hand-built graphs, checked against numpy written out by hand."""

import numpy as np
import pytest

from compiler.errors import ShapeError, TesselError
from compiler.graph.ir import Graph, Node, TensorType, Value
from compiler.graph.reference import run_reference

RNG = np.random.default_rng(0)


def _dense_relu_graph() -> tuple[Graph, np.ndarray, np.ndarray]:
    graph = Graph()
    x = graph.add_input("x", TensorType((2, 3), "float32"))
    weight = RNG.standard_normal((3, 4)).astype(np.float32)
    bias = RNG.standard_normal(4).astype(np.float32)
    (product,) = graph.add_node("MatMul", [x, graph.add_param("weight", weight)])
    (shifted,) = graph.add_node("Add", [product, graph.add_param("bias", bias)])
    graph.outputs = graph.add_node("Relu", [shifted], name="y")
    return graph, weight, bias


def test_dense_relu_matches_numpy():
    graph, weight, bias = _dense_relu_graph()
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    result = run_reference(graph, {"x": x})
    assert list(result) == ["y"]
    np.testing.assert_allclose(result["y"], np.maximum(x @ weight + bias, 0), rtol=1e-6)
    assert result["y"].dtype == np.float32


def test_multiple_outputs_come_back_in_graph_order():
    graph = Graph()
    x = graph.add_input("x", TensorType((4, 6), "float32"))
    left, right = graph.add_node("Split", [x], {"axis": 1, "_outputs": 2}, output_names=["left", "right"])
    (total,) = graph.add_node("ReduceSum", [x], {"keepdims": 0}, output_names=["total"])
    graph.outputs = [total, right, left]
    x_value = RNG.standard_normal((4, 6)).astype(np.float32)
    result = run_reference(graph, {"x": x_value})
    assert list(result) == ["total", "right", "left"]
    np.testing.assert_allclose(result["total"], np.array(x_value.sum(), dtype=np.float32), rtol=1e-5)
    np.testing.assert_array_equal(result["left"], x_value[:, :3])
    np.testing.assert_array_equal(result["right"], x_value[:, 3:])


def test_a_param_output_is_returned_as_a_copy():
    graph = Graph()
    graph.add_input("x", TensorType((1,), "float32"))
    constant = graph.add_param("c", np.arange(3, dtype=np.int64))
    graph.outputs = [constant]
    result = run_reference(graph, {"x": np.zeros(1, np.float32)})
    result["c"][0] = 99
    np.testing.assert_array_equal(graph.params[constant], [0, 1, 2])


def test_unknown_and_missing_inputs_are_named_with_the_expected_ones():
    graph, _, _ = _dense_relu_graph()
    with pytest.raises(ShapeError) as error:
        run_reference(graph, {"input": np.zeros((2, 3), np.float32)})
    message = str(error.value)
    assert "unknown input(s) 'input'" in message
    assert "missing input(s) 'x'" in message
    assert "'x' float32[2,3]" in message


def test_wrong_shape_says_what_was_expected():
    graph, _, _ = _dense_relu_graph()
    with pytest.raises(ShapeError, match=r"'x' has shape \[3, 2\], but the graph takes \[2, 3\]"):
        run_reference(graph, {"x": np.zeros((3, 2), np.float32)})


def test_wrong_dtype_says_what_was_expected():
    graph, _, _ = _dense_relu_graph()
    with pytest.raises(TesselError, match="'x' has dtype float64, but the graph takes float32") as error:
        run_reference(graph, {"x": np.zeros((2, 3))})
    assert not isinstance(error.value, ShapeError)


def _scale_shift_relu_body() -> Graph:
    body = Graph(name="body")
    data = body.add_input("data", TensorType((2, 3), "float32"))
    scale = body.add_input("scale", TensorType((3,), "float32"))
    (scaled,) = body.add_node("Mul", [data, scale])
    (shifted,) = body.add_node("Add", [scaled, body.add_param("shift", np.full(3, -0.5, np.float32))])
    body.outputs = [*body.add_node("Relu", [shifted]), scaled]
    return body


def test_a_fused_node_runs_its_body():
    graph = Graph()
    x = graph.add_input("x", TensorType((2, 3), "float32"))
    scale = graph.add_param("scale", np.array([1.0, 2.0, 3.0], np.float32))
    outputs = [Value("activated", TensorType((2, 3), "float32")), Value("scaled", TensorType((2, 3), "float32"))]
    graph.nodes.append(Node("fused", [x, scale], outputs, {"body": _scale_shift_relu_body()}, "group0"))
    (negated,) = graph.add_node("Neg", [outputs[1]], name="negated")
    graph.outputs = [outputs[0], negated]
    graph.verify()
    x_value = RNG.standard_normal((2, 3)).astype(np.float32)
    result = run_reference(graph, {"x": x_value})
    scaled = x_value * np.array([1, 2, 3], np.float32)
    np.testing.assert_allclose(result["activated"], np.maximum(scaled - 0.5, 0), rtol=1e-6)
    np.testing.assert_allclose(result["negated"], -scaled, rtol=1e-6)


def test_a_result_that_disagrees_with_inference_names_the_node():
    graph = Graph()
    x = graph.add_input("x", TensorType((2, 3), "float32"))
    wrong = Value("y", TensorType((3, 2), "float32"))
    graph.nodes.append(Node("Relu", [x], [wrong], {}, "mistyped_relu"))
    graph.outputs = [wrong]
    with pytest.raises(AssertionError, match=r"mistyped_relu \(Relu\) computed float32\[2, 3\]"):
        run_reference(graph, {"x": np.zeros((2, 3), np.float32)})
