"""Data-movement and shape computes, compiled for llvm and wasm, against the numpy references."""

import numpy as np
from kernel_check import check, check_one_kernel

from compiler.graph.ir import Graph, TensorType

RNG = np.random.default_rng(5)


def _graph(inputs: dict[str, TensorType]) -> tuple[Graph, list]:
    graph = Graph(name="transform")
    return graph, [graph.add_input(name, type) for name, type in inputs.items()]


def _outputs(graph: Graph, nodes) -> Graph:
    graph.outputs = [graph.add_node(op, inputs, attrs)[0] for op, inputs, attrs in nodes]
    return graph


def _data(shape, dtype="float32") -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def test_reshapes_and_transposes():
    graph, (x,) = _graph({"x": TensorType((2, 3, 4, 5), "float32")})
    nodes = [
        ("Reshape", [x], {"shape": np.array([6, -1])}),
        ("Reshape", [x], {"shape": np.array([0, 4, 15])}),
        ("Flatten", [x], {"axis": 2}),
        ("Flatten", [x], {"axis": -1}),
        ("Unsqueeze", [x], {"axes": np.array([0, -1])}),
        ("Transpose", [x], {"perm": [0, 3, 1, 2]}),
        ("Transpose", [x], {}),
        ("Tile", [x], {"repeats": np.array([1, 2, 1, 3])}),
        ("Expand", [x], {"shape": np.array([3, 1, 3, 1, 5])}),
        ("Trilu", [x], {"k": np.int64(1)}),
        ("Trilu", [x], {"upper": 0, "k": np.int64(-1)}),
    ]
    check_one_kernel(_outputs(graph, nodes), {"x": _data((2, 3, 4, 5))})


def test_squeeze_and_int_and_bool_movement():
    graph, (x, flags) = _graph({"x": TensorType((3, 1, 4, 1), "int64"), "f": TensorType((2, 3), "bool")})
    nodes = [
        ("Squeeze", [x], {"axes": np.array([-1])}),
        ("Squeeze", [x], {}),
        ("Transpose", [flags], {}),
        ("Reshape", [flags], {"shape": np.array([6])}),
    ]
    inputs = {"x": RNG.integers(-100, 100, (3, 1, 4, 1)), "f": RNG.integers(0, 2, (2, 3)).astype(bool)}
    check_one_kernel(_outputs(graph, nodes), inputs)


def test_concat_and_split():
    graph, (a, b, c) = _graph(
        {
            "a": TensorType((2, 3, 4), "float32"),
            "b": TensorType((2, 1, 4), "float32"),
            "c": TensorType((2, 0, 4), "float32"),
        }
    )
    (joined,) = graph.add_node("Concat", [a, b, c, a], {"axis": 1})
    (last,) = graph.add_node("Concat", [a, a], {"axis": -1})
    parts = graph.add_node("Split", [joined], {"axis": 1, "split": np.array([2, 3, 2]), "_outputs": 3})
    halves = graph.add_node("Split", [last], {"axis": -1, "num_outputs": 3, "_outputs": 3})
    graph.outputs = [joined, last, *parts, *halves]
    inputs = {"a": _data((2, 3, 4)), "b": _data((2, 1, 4)), "c": _data((2, 0, 4))}
    check_one_kernel(graph, inputs)


def test_slices_with_negative_steps_and_clamped_bounds():
    graph, (x,) = _graph({"x": TensorType((5, 6, 7), "float32")})
    nodes = [
        ("Slice", [x], {"starts": np.array([1, -2]), "ends": np.array([4, 1000]), "axes": np.array([0, 2])}),
        ("Slice", [x], {"starts": np.array([-1]), "ends": np.array([-1000]), "axes": np.array([1]), "steps": [-2]}),
        ("Slice", [x], {"starts": np.array([4, 0]), "ends": np.array([0, 7]), "axes": [0, -1], "steps": [-1, 3]}),
        ("Slice", [x], {"starts": np.array([0]), "ends": np.array([6]), "steps": np.array([2])}),
    ]
    check_one_kernel(_outputs(graph, nodes), {"x": _data((5, 6, 7))})


def test_pad_modes_and_negative_pads():
    graph, (x,) = _graph({"x": TensorType((3, 4), "float32")})
    pads = np.array([1, 2, 2, 3])
    nodes = [("Pad", [x], {"pads": pads, "mode": mode}) for mode in ("reflect", "edge", "wrap")]
    nodes += [
        ("Pad", [x], {"pads": pads, "constant_value": np.float32(1.5)}),
        ("Pad", [x], {"pads": np.array([-1, 1, 0, -2])}),
        ("Pad", [x], {"pads": np.array([-1, 5, 0, 6]), "mode": "reflect"}),
        ("Pad", [x], {"pads": np.array([2, 7]), "axes": np.array([-1]), "mode": "wrap"}),
    ]
    check_one_kernel(_outputs(graph, nodes), {"x": _data((3, 4))})


def test_gathers_with_negative_indices():
    graph, (data, indices, elements) = _graph(
        {"d": TensorType((4, 5, 3), "float32"), "i": TensorType((2, 3), "int64"), "e": TensorType((4, 2, 3), "int32")}
    )
    nodes = [
        ("Gather", [data, indices], {"axis": 0}),
        ("Gather", [data, indices], {"axis": 1}),
        ("Gather", [data, indices], {"axis": -1}),
        ("GatherElements", [data, elements], {"axis": 1}),
    ]
    inputs = {
        "d": _data((4, 5, 3)),
        "i": np.array([[0, -1, 2], [-3, 1, 0]], np.int64),
        "e": RNG.integers(-5, 5, (4, 2, 3)).astype(np.int32),
    }
    check_one_kernel(_outputs(graph, nodes), inputs)


def test_depth_and_space_rearrangements():
    graph, (x,) = _graph({"x": TensorType((1, 8, 2, 3), "float32")})
    nodes = [("DepthToSpace", [x], {"blocksize": 2, "mode": mode}) for mode in ("DCR", "CRD")]
    (deep,) = graph.add_node("DepthToSpace", [x], {"blocksize": 2})
    nodes += [("SpaceToDepth", [deep], {"blocksize": 2, "mode": mode}) for mode in ("DCR", "CRD")]
    graph = _outputs(graph, nodes)
    check_one_kernel(graph, {"x": _data((1, 8, 2, 3))})


def test_shape_producers():
    graph, (x,) = _graph({"x": TensorType((2, 3, 4), "float32")})
    nodes = [
        ("Shape", [x], {}),
        ("Shape", [x], {"start": 1, "end": -1}),
        ("Size", [x], {}),
        ("ConstantOfShape", [], {"input": np.array([2, 3]), "value": np.array([7], np.int32)}),
        ("Range", [], {"start": np.float32(1.0), "limit": np.float32(4.0), "delta": np.float32(0.5)}),
        ("Range", [], {"start": np.int64(10), "limit": np.int64(-3), "delta": np.int64(-4)}),
    ]
    check_one_kernel(_outputs(graph, nodes), {"x": _data((2, 3, 4))})


def test_fused_transpose_reshape_is_one_kernel():
    graph, (x,) = _graph({"x": TensorType((2, 6, 4), "float32")})
    (moved,) = graph.add_node("Transpose", [x], {"perm": [0, 2, 1]})
    (flat,) = graph.add_node("Reshape", [moved], {"shape": np.array([2, 24])})
    (biased,) = graph.add_node("Add", [flat, flat])
    graph.outputs = [biased]
    check(graph, {"x": _data((2, 6, 4))})


def test_scatter_elements_every_reduction_and_shorter_indices():
    """The last update wins along each line without a reduction; add, max and min combine repeats with the data;
    indices shorter than the data off the axis (BART's decoder ids: the first column of the ids shifted right)."""
    graph, (x, ids) = _graph({"x": TensorType((3, 5), "float32"), "ids": TensorType((2, 6), "int64")})
    repeats = graph.add_param("repeats", np.array([[0, 4, 4], [2, 2, -5], [1, 3, 0]], np.int64))
    updates = graph.add_param("updates", RNG.standard_normal((3, 3)).astype(np.float32))
    nodes = [
        ("ScatterElements", [x, repeats, updates], {"axis": 1, "reduction": reduction})
        for reduction in ("none", "add", "max", "min")
    ]
    rows = graph.add_param("rows", np.array([[2, 0, 1, 1, 2]], np.int32))
    nodes.append(("ScatterElements", [x, rows, graph.add_param("row", _data((1, 5)))], {"axis": 0}))
    first = graph.add_param("first", np.zeros((2, 1), np.int64))
    start = graph.add_param("start", np.full((2, 1), 2, np.int64))
    nodes.append(("ScatterElements", [ids, first, start], {"axis": 1}))
    graph = _outputs(graph, nodes)
    check(graph, {"x": _data((3, 5)), "ids": RNG.integers(3, 50, (2, 6)).astype(np.int64)})
