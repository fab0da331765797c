"""Reduction computes (ReduceX, ArgMax/ArgMin, TopK, CumSum, Einsum), compiled for llvm and wasm, against the numpy references."""

import numpy as np
import pytest
from kernel_check import check, check_one_kernel

from compiler.errors import ShapeError
from compiler.graph.ir import Graph, TensorType

RNG = np.random.default_rng(11)
REDUCTIONS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2"]
REDUCTIONS += ["ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]


def _graph(inputs: dict[str, TensorType]) -> tuple[Graph, list]:
    graph = Graph(name="reduce")
    return graph, [graph.add_input(name, type) for name, type in inputs.items()]


def _outputs(graph: Graph, nodes) -> Graph:
    graph.outputs = [graph.add_node(op, inputs, attrs)[0] for op, inputs, attrs in nodes]
    return graph


def _every_reduction(x, attrs) -> list:
    return [(op, [x], attrs) for op in REDUCTIONS]


def test_every_reduction_over_negative_and_multiple_axes():
    graph, (x,) = _graph({"x": TensorType((3, 4, 5), "float32")})
    nodes = _every_reduction(x, {"axes": np.array([-1]), "keepdims": 1})
    nodes += _every_reduction(x, {"axes": np.array([0, 2]), "keepdims": 0})
    inputs = {"x": RNG.uniform(0.5, 1.5, (3, 4, 5)).astype(np.float32)}
    check_one_kernel(_outputs(graph, nodes), inputs, rtol=1e-4, atol=1e-5)


def test_reductions_over_all_axes_and_no_axes():
    graph, (x,) = _graph({"x": TensorType((2, 6), "float32")})
    nodes = _every_reduction(x, {"keepdims": 0})
    nodes += [(op, [x], {"axes": np.array([], np.int64), "noop_with_empty_axes": 1}) for op in REDUCTIONS]
    inputs = {"x": RNG.uniform(0.5, 1.5, (2, 6)).astype(np.float32)}
    check_one_kernel(_outputs(graph, nodes), inputs, rtol=1e-4, atol=1e-5)


def test_long_product_and_log_sum_exp_of_large_values():
    graph, (x, large) = _graph({"x": TensorType((3, 300), "float32"), "l": TensorType((2, 7), "float32")})
    nodes = [
        ("ReduceProd", [x], {"axes": np.array([1])}),
        ("ReduceLogSumExp", [large], {"axes": np.array([1])}),
        ("ReduceMax", [large], {"axes": np.array([0])}),
    ]
    large_data = RNG.uniform(-5, 5, (2, 7)).astype(np.float32) + np.float32(200)
    large_data[1, :] = -np.inf
    inputs = {"x": RNG.uniform(0.99, 1.01, (3, 300)).astype(np.float32), "l": large_data}
    check_one_kernel(_outputs(graph, nodes), inputs, rtol=1e-4, atol=1e-5)


def test_integer_reductions():
    graph, (x,) = _graph({"x": TensorType((4, 5), "int32")})
    axes = {"axes": np.array([1])}
    nodes = [(op, [x], axes) for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean")]
    nodes += [("ReduceSumSquare", [x], {"axes": np.array([0])}), ("ReduceL1", [x], {"axes": np.array([0])})]
    inputs = {"x": RNG.integers(-6, 7, (4, 5)).astype(np.int32)}
    check_one_kernel(_outputs(graph, nodes), inputs)


def test_float16_sum_accumulates_wider():
    graph, (x,) = _graph({"x": TensorType((2, 512), "float16")})
    nodes = [("ReduceSum", [x], {"axes": np.array([1])}), ("ReduceMean", [x], {"axes": np.array([1])})]
    inputs = {"x": RNG.uniform(0, 1, (2, 512)).astype(np.float16)}
    check_one_kernel(_outputs(graph, nodes), inputs, rtol=2e-3, atol=1e-3)


def test_reduction_over_an_empty_axis():
    graph, (x,) = _graph({"x": TensorType((2, 0, 3), "float32")})
    nodes = [(op, [x], {"axes": np.array([1])}) for op in ("ReduceSum", "ReduceProd", "ReduceMax", "ReduceLogSum")]
    check_one_kernel(_outputs(graph, nodes), {"x": np.zeros((2, 0, 3), np.float32)})


def test_arg_max_and_min_with_ties_and_last_index():
    graph, (x, n) = _graph({"x": TensorType((3, 6), "float32"), "n": TensorType((2, 3, 4), "int32")})
    nodes = []
    for op in ("ArgMax", "ArgMin"):
        nodes += [
            (op, [x], {"axis": 1}),
            (op, [x], {"axis": -1, "select_last_index": 1, "keepdims": 0}),
            (op, [x], {"axis": 0, "keepdims": 0}),
            (op, [n], {"axis": 1, "select_last_index": 1}),
            (op, [n], {"axis": -1}),
        ]
    data = np.array(
        [[1, 3, 3, 0, -1, 3], [2, 2, 2, 2, 2, 2], [np.nan, 5, np.nan, -7, 0, 1]],
        np.float32,
    )
    inputs = {"x": data, "n": RNG.integers(-2, 3, (2, 3, 4)).astype(np.int32)}
    check_one_kernel(_outputs(graph, nodes), inputs)


def test_reduce_mean_absorbs_its_exp_producer():
    graph, (x,) = _graph({"x": TensorType((4, 16), "float32")})
    (exponential,) = graph.add_node("Exp", [x])
    (mean,) = graph.add_node("ReduceMean", [exponential], {"axes": np.array([1]), "keepdims": 1})
    (shifted,) = graph.add_node("Sub", [mean, x])
    graph.outputs = [shifted]
    check(graph, {"x": RNG.standard_normal((4, 16)).astype(np.float32)}, rtol=1e-4, atol=1e-5)


def test_topk_with_ties_nan_negative_axes_and_both_orders():
    """TopK against the reference (ONNX's order: ties to the lower position, NaN above every number), values and
    indices, floats and ints, every k from none to the whole axis."""
    graph, (x, n) = _graph({"x": TensorType((3, 6), "float32"), "n": TensorType((2, 3, 4), "int32")})
    (negated,) = graph.add_node("Neg", [x])  # fused into the TopK's group, read at the chosen positions too
    cases = [
        (x, {"k": np.array([4]), "axis": 1}),
        (negated, {"k": np.array([3]), "axis": 1}),
        (x, {"k": np.array([6]), "axis": -1, "largest": 0}),
        (x, {"k": np.array([2]), "axis": 0}),
        (x, {"k": np.array([0]), "axis": 1}),
        (x, {"k": 2, "axis": 1}),  # opset 1: k an attribute
        (n, {"k": np.array([3]), "axis": 1, "largest": 0}),
        (n, {"k": np.array([4]), "axis": -1, "sorted": 0}),
    ]
    graph.outputs = [output for tensor, attrs in cases for output in graph.add_node("TopK", [tensor], attrs)]
    data = np.array(
        [[1, 3, 3, 0, -1, 3], [2, 2, 2, 2, 2, 2], [np.nan, 5, np.nan, -7, 0, 1]],
        np.float32,
    )
    check(graph, {"x": data, "n": RNG.integers(-2, 3, (2, 3, 4)).astype(np.int32)})


def test_topk_k_larger_than_the_axis_is_refused():
    graph, (x,) = _graph({"x": TensorType((2, 5), "float32")})
    with pytest.raises(ShapeError, match="TopK's k is 6, but the axis it selects from has 5 elements"):
        graph.add_node("TopK", [x], {"k": np.array([6]), "axis": 1})


def test_cumsum_every_direction_and_roberta_position_ids():
    """Inclusive and exclusive, forward and reversed, along each axis; and the position ids RoBERTa's exporter
    writes: a running count of the tokens that are not padding, masked and shifted by the pad id."""
    graph, (x, ids) = _graph({"x": TensorType((3, 5, 4), "float32"), "ids": TensorType((2, 9), "int64")})
    outputs = []
    for axis, exclusive, reverse in [(1, 0, 0), (1, 1, 0), (-1, 0, 1), (0, 1, 1)]:
        attrs = {"axis": np.array(axis, np.int64), "exclusive": exclusive, "reverse": reverse}
        outputs += graph.add_node("CumSum", [x], attrs)
    (not_pad,) = graph.add_node("Not", graph.add_node("Equal", [ids, graph.add_param("pad", np.array(1, np.int64))]))
    (mask,) = graph.add_node("Cast", [not_pad], {"to": "int32"})
    (count,) = graph.add_node("CumSum", [mask], {"axis": np.array(1, np.int32)})
    (positions,) = graph.add_node("Mul", [count, mask])
    graph.outputs = [*outputs, positions]
    tokens = RNG.integers(2, 50, (2, 9))
    tokens[:, 6:] = 1
    check(graph, {"x": RNG.standard_normal((3, 5, 4)).astype(np.float32), "ids": tokens}, rtol=1e-5, atol=1e-5)


def test_einsum_contractions_diagonals_and_broadcasts():
    """Batched products (MaxViT's attention scores), an implicit output, a broadcast '...', a diagonal, a sum to a
    scalar and an outer product; the first fused with the Mul that feeds it."""
    shapes = {"q": (1, 2, 5, 4), "k": (1, 2, 6, 4), "x": (3, 3)}
    graph, (q, k, x) = _graph({name: TensorType(shape, "float32") for name, shape in shapes.items()})
    (scaled,) = graph.add_node("Mul", [q, graph.add_param("scale", np.array(0.5, np.float32))])
    nodes = [
        ("Einsum", [scaled, k], {"equation": "bhid,bhjd->bhij"}),
        ("Einsum", [x, x], {"equation": "ij,jk"}),
        ("Einsum", [q, k], {"equation": "...id,...jd->...ij"}),
        ("Einsum", [x], {"equation": "ii->i"}),
        ("Einsum", [x], {"equation": "ij->"}),
        ("Einsum", [x, x], {"equation": "ij,kl->ikjl"}),
    ]
    inputs = {name: RNG.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    check(_outputs(graph, nodes), inputs, rtol=1e-5, atol=1e-5)


def test_einsum_sums_float16_in_float32():
    graph, (h,) = _graph({"h": TensorType((2, 64), "float16")})
    graph = _outputs(graph, [("Einsum", [h, h], {"equation": "ij,kj->ik"})])
    check(graph, {"h": RNG.standard_normal((2, 64)).astype(np.float16)}, rtol=2e-3, atol=1e-3)
