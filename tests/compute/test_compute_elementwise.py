"""Elementwise and broadcast computes, compiled for llvm and wasm, against the numpy references (many ops per
kernel to keep the number of builds small)."""

import numpy as np
from kernel_check import check, check_one_kernel

from compiler.graph.ir import Graph, TensorType

RNG = np.random.default_rng(7)


def _graph(inputs: dict[str, TensorType]) -> tuple[Graph, list]:
    graph = Graph(name="elementwise")
    return graph, [graph.add_input(name, type) for name, type in inputs.items()]


def _outputs(graph: Graph, nodes) -> Graph:
    graph.outputs = [graph.add_node(op, inputs, attrs)[0] for op, inputs, attrs in nodes]
    return graph


def _float_data(shape, scale=3.0) -> np.ndarray:
    data = (RNG.standard_normal(shape) * scale).astype(np.float32)
    # exact halves check round-half-to-even; zeros check the signs and thresholds
    special = np.array([2.5, -0.5, 0.5, -2.5, 0.0, 1.0], np.float32)[: data.size]
    data.reshape(-1)[: special.size] = special
    return data


def test_arithmetic_unary_ops():
    graph, (x,) = _graph({"x": TensorType((3, 4, 5), "float32")})
    ops = ["Neg", "Abs", "Relu", "Floor", "Ceil", "Round", "Sign", "Softsign", "Identity", "Reciprocal"]
    nodes = [(op, [x], {}) for op in ops]
    nodes += [
        ("LeakyRelu", [x], {"alpha": 0.1}),
        ("HardSigmoid", [x], {"alpha": 0.3, "beta": 0.4}),
        ("HardSwish", [x], {}),
        ("ThresholdedRelu", [x], {"alpha": 0.5}),
        ("Clip", [x], {"min": np.float32(-1.5), "max": np.float32(2.0)}),
        ("Clip", [x], {"min": np.float32(0.5)}),
        ("Clip", [x], {"min": np.float32(2.0), "max": np.float32(1.0)}),
    ]
    check_one_kernel(_outputs(graph, nodes), {"x": _float_data((3, 4, 5))})


def test_transcendental_unary_ops():
    graph, (x, positive) = _graph({"x": TensorType((4, 33), "float32"), "p": TensorType((4, 33), "float32")})
    ops = ["Sigmoid", "Tanh", "Exp", "Erf", "Sin", "Cos", "Elu", "Selu", "Softplus"]
    nodes = [(op, [x], {}) for op in ops] + [("Log", [positive], {}), ("Sqrt", [positive], {})]
    nodes += [
        ("Celu", [x], {"alpha": 2.0}),
        ("Elu", [x], {"alpha": 0.5}),
        ("Gelu", [x], {}),
        ("Gelu", [x], {"approximate": "tanh"}),
    ]
    inputs = {"x": _float_data((4, 33)), "p": RNG.uniform(1e-3, 50, (4, 33)).astype(np.float32)}
    check_one_kernel(_outputs(graph, nodes), inputs, rtol=1e-4, atol=1e-5)


def test_sin_and_cos_over_several_turns():
    graph, (x,) = _graph({"x": TensorType((200,), "float32")})
    inputs = {"x": np.linspace(-40, 40, 200, dtype=np.float32)}
    check_one_kernel(_outputs(graph, [("Sin", [x], {}), ("Cos", [x], {})]), inputs, atol=1e-5)


def test_special_values():
    graph, (x,) = _graph({"x": TensorType((8,), "float32")})
    nodes = [
        ("IsNaN", [x], {}),
        ("IsInf", [x], {}),
        ("IsInf", [x], {"detect_negative": 0}),
        ("IsInf", [x], {"detect_positive": 0}),
        ("Relu", [x], {}),
        ("Sign", [x], {}),
        ("Max", [x, x], {}),
        ("Exp", [x], {}),
        ("Sigmoid", [x], {}),
    ]
    inputs = {"x": np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -100.0, 100.0], np.float32)}
    check_one_kernel(_outputs(graph, nodes), inputs, rtol=1e-4, atol=1e-6)


def test_broadcast_binary_and_variadic_ops():
    graph, (a, b, c, scalar) = _graph(
        {
            "a": TensorType((2, 3, 4), "float32"),
            "b": TensorType((3, 1), "float32"),
            "c": TensorType((4,), "float32"),
            "s": TensorType((), "float32"),
        }
    )
    nodes = [
        ("Add", [a, b], {}),
        ("Sub", [b, a], {}),
        ("Mul", [a, c], {}),
        ("Div", [a, b], {}),
        ("Add", [scalar, c], {}),
        ("Max", [a, b, c], {}),
        ("Min", [c, b, a], {}),
        ("Sum", [a, b, c], {}),
        ("Mean", [a, b, c], {}),
        ("PRelu", [a, c], {}),
        ("Mod", [a, b], {"fmod": 1}),
    ]
    inputs = {
        "a": _float_data((2, 3, 4)),
        "b": RNG.uniform(0.5, 2, (3, 1)).astype(np.float32),
        "c": _float_data((4,)),
        "s": np.array(1.5, np.float32),
    }
    check_one_kernel(_outputs(graph, nodes), inputs)


def test_power_and_comparisons_and_where():
    graph, (a, b, condition) = _graph(
        {"a": TensorType((3, 4), "float32"), "b": TensorType((4,), "float32"), "c": TensorType((3, 1), "bool")}
    )
    nodes = [
        ("Pow", [a, b], {}),
        ("Equal", [a, b], {}),
        ("Greater", [a, b], {}),
        ("Less", [a, b], {}),
        ("GreaterOrEqual", [a, b], {}),
        ("LessOrEqual", [a, b], {}),
        ("Where", [condition, a, b], {}),
    ]
    a_data = RNG.uniform(-3, 3, (3, 4)).astype(np.float32)
    a_data[0, :2] = [2.0, 1.0]
    inputs = {
        "a": a_data,
        "b": np.array([2.0, 1.0, 3.0, -1.0], np.float32),
        "c": np.array([[True], [False], [True]]),
    }
    check_one_kernel(_outputs(graph, nodes), inputs, rtol=1e-5, atol=1e-5)


def test_logical_ops():
    graph, (a, b) = _graph({"a": TensorType((2, 5), "bool"), "b": TensorType((5,), "bool")})
    nodes = [("And", [a, b], {}), ("Or", [a, b], {}), ("Xor", [a, b], {}), ("Not", [a], {}), ("Equal", [a, b], {})]
    inputs = {"a": RNG.integers(0, 2, (2, 5)).astype(bool), "b": RNG.integers(0, 2, (5,)).astype(bool)}
    check_one_kernel(_outputs(graph, nodes), inputs)


def test_integer_ops():
    graph, (a, b, exponent, wide) = _graph(
        {
            "a": TensorType((4, 6), "int32"),
            "b": TensorType((6,), "int32"),
            "e": TensorType((6,), "int32"),
            "w": TensorType((4, 6), "int64"),
        }
    )
    nodes = [
        ("Div", [a, b], {}),
        ("Mod", [a, b], {}),
        ("Mod", [a, b], {"fmod": 1}),
        ("Add", [a, b], {}),
        ("Mul", [a, b], {}),
        ("Sub", [a, b], {}),
        ("Abs", [a], {}),
        ("Neg", [a], {}),
        ("Sign", [a], {}),
        ("Max", [a, b], {}),
        ("Less", [a, b], {}),
        ("Clip", [a], {"min": np.int32(-3), "max": np.int32(4)}),
        ("Mul", [wide, wide], {}),
        ("Pow", [a, exponent], {}),
    ]
    inputs = {
        "a": RNG.integers(-9, 10, (4, 6)).astype(np.int32),
        # a zero divisor gives 0, as the reference has it
        "b": np.array([3, -4, 0, 1, 2, -1], np.int32),
        "e": np.array([0, 1, 2, 3, 5, 7], np.int32),
        "w": RNG.integers(-(2**20), 2**20, (4, 6)).astype(np.int64),
    }
    check_one_kernel(_outputs(graph, nodes), inputs)


def test_pow_of_integer_base_with_float_exponent():
    graph, (base, exponent) = _graph({"a": TensorType((3,), "int32"), "e": TensorType((3,), "float32")})
    inputs = {"a": np.array([1, 2, 3], np.int32), "e": np.array([4.0, 5.0, 6.0], np.float32)}
    check_one_kernel(_outputs(graph, [("Pow", [base, exponent], {})]), inputs)


def test_casts():
    graph, (x, flags, counts, half) = _graph(
        {
            "x": TensorType((2, 8), "float32"),
            "f": TensorType((2, 8), "bool"),
            "n": TensorType((2, 8), "int32"),
            "h": TensorType((2, 8), "float16"),
        }
    )
    nodes = [("Cast", [x], {"to": to}) for to in ("int32", "int64", "bool", "float16", "float64", "int8")]
    nodes += [
        ("Cast", [flags], {"to": "float32"}),
        ("Cast", [flags], {"to": "int32"}),
        ("Cast", [counts], {"to": "float32"}),
        ("Cast", [counts], {"to": "int64"}),
        ("Cast", [counts], {"to": "bool"}),
        ("Cast", [half], {"to": "float32"}),
        ("CastLike", [counts, x], {}),
    ]
    x_data = _float_data((2, 8), scale=30.0)
    x_data[0, :4] = [-2.7, 2.7, np.nan, -0.2]
    inputs = {
        "x": x_data,
        "f": RNG.integers(0, 2, (2, 8)).astype(bool),
        "n": RNG.integers(-5, 5, (2, 8)).astype(np.int32),
        "h": _float_data((2, 8)).astype(np.float16),
    }
    graph = _outputs(graph, nodes)
    # NaN to an integer is undefined; only the bool and float casts may see it
    outputs = graph.outputs
    graph.outputs = [v for v in outputs if v.type.dtype in ("bool", "float16", "float64")]
    check_one_kernel(graph, inputs)
    inputs["x"][0, 2] = 0.5
    graph.outputs = outputs
    check_one_kernel(graph, inputs)


def test_float16_arithmetic():
    graph, (a, b) = _graph({"a": TensorType((4, 8), "float16"), "b": TensorType((8,), "float16")})
    nodes = [("Add", [a, b], {}), ("Mul", [a, b], {}), ("Relu", [a], {}), ("Sigmoid", [a], {}), ("Div", [a, b], {})]
    inputs = {"a": _float_data((4, 8)).astype(np.float16), "b": RNG.uniform(0.5, 2, (8,)).astype(np.float16)}
    check_one_kernel(_outputs(graph, nodes), inputs, rtol=2e-3, atol=1e-3)


def test_dropout_in_inference_mode_copies_and_masks():
    graph, (x,) = _graph({"x": TensorType((3, 5), "float32")})
    copy, mask = graph.add_node("Dropout", [x], {"ratio": 0.5, "_outputs": 2})
    graph.outputs = [copy, mask]
    check_one_kernel(graph, {"x": _float_data((3, 5))})


def test_fused_add_relu_mul_chain_is_one_kernel():
    graph, (a, b) = _graph({"a": TensorType((2, 16, 8), "float32"), "b": TensorType((16, 1), "float32")})
    (total,) = graph.add_node("Add", [a, b])
    (rectified,) = graph.add_node("Relu", [total])
    (scaled,) = graph.add_node("Mul", [rectified, b])
    graph.outputs = [scaled]
    check(graph, {"a": _float_data((2, 16, 8)), "b": _float_data((16, 1))})
