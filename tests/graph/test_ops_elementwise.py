"""Elementwise and broadcast ops: shape rules and numpy references against onnxruntime."""

import numpy as np
import pytest
from onnx import helper
from single_node import check_op

from compiler.errors import ModelError, ShapeError, UnsupportedOpError
from compiler.graph.ir import TensorType
from compiler.graph.registry import Pattern, get_op

RNG = np.random.default_rng(0)


def normal(*shape, dtype="float32", scale=2.0):
    return np.asarray(RNG.standard_normal(shape) * scale).astype(dtype)


def integers(*shape, dtype="int32", low=-20, high=20):
    return np.asarray(RNG.integers(low, high, shape)).astype(dtype)


UNARY = [
    ("Neg", {}),
    ("Abs", {}),
    ("Relu", {}),
    ("LeakyRelu", {}),
    ("LeakyRelu", {"alpha": 0.3}),
    ("Sigmoid", {}),
    ("Tanh", {}),
    ("Exp", {}),
    ("Erf", {}),
    ("HardSigmoid", {}),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
    ("HardSwish", {}),
    ("Floor", {}),
    ("Ceil", {}),
    ("Sign", {}),
    ("Softplus", {}),
    ("Softsign", {}),
    ("Elu", {}),
    ("Elu", {"alpha": 0.5}),
    ("Selu", {}),
    ("Selu", {"alpha": 1.5, "gamma": 2.0}),
    ("Celu", {}),
    ("Celu", {"alpha": 2.0}),
    ("ThresholdedRelu", {}),
    ("ThresholdedRelu", {"alpha": 0.5}),
    ("Gelu", {}),
    ("Gelu", {"approximate": "tanh"}),
    ("Sin", {}),
    ("Cos", {}),
    ("Identity", {}),
    ("Reciprocal", {}),
]


@pytest.mark.parametrize(("op", "attrs"), UNARY, ids=[f"{op}-{attrs}" for op, attrs in UNARY])
def test_unary_float32(op, attrs):
    check_op(op, [normal(2, 3, 5)], attrs)


@pytest.mark.parametrize("op", ["Log", "Sqrt"])
def test_unary_on_positive_inputs(op):
    check_op(op, [np.abs(normal(3, 4)) + 0.01])


# onnxruntime's CPU kernels cover these dtype pairs
@pytest.mark.parametrize("dtype", ["float16", "float64"])
@pytest.mark.parametrize("op", ["Sigmoid", "Tanh", "Exp", "Relu", "Neg", "Abs", "Floor"])
def test_unary_other_float_dtypes(op, dtype):
    check_op(op, [normal(4, 6, dtype=dtype)], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
@pytest.mark.parametrize("op", ["Abs", "Neg", "Sign"])
def test_unary_integers(op, dtype):
    check_op(op, [integers(3, 5, dtype=dtype)])


@pytest.mark.parametrize("dtype", ["int8", "int32"])
def test_relu_integers(dtype):
    check_op("Relu", [integers(3, 5, dtype=dtype)])


def test_sigmoid_tails_keep_relative_precision():
    x = np.array([-100.0, -30.0, -5.0, 0.0, 5.0, 30.0, 100.0], dtype=np.float32)
    check_op("Sigmoid", [x], rtol=1e-4, atol=1e-10)


def test_round_is_half_to_even():
    check_op("Round", [np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.4, 2.6], dtype=np.float32)])


def test_scalar_input_stays_an_array():
    (result,) = get_op("Exp").run_reference([np.array(1.0, dtype=np.float32)], {})
    assert isinstance(result, np.ndarray) and result.shape == () and result.dtype == np.float32


BINARY_SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (3, 2)), ((5, 1), ())]


@pytest.mark.parametrize(("shape_a", "shape_b"), BINARY_SHAPES)
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_arithmetic_broadcasts(op, shape_a, shape_b):
    divisor = normal(*shape_b)
    check_op(op, [normal(*shape_a), np.where(np.abs(divisor) < 0.1, 1.0, divisor).astype(np.float32)])


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_arithmetic_on_integers(op, dtype):
    divisor = integers(4, 5, dtype=dtype)
    check_op(op, [integers(3, 4, 5, dtype=dtype, low=-100, high=100), np.where(divisor == 0, 3, divisor)])


def test_integer_div_truncates_toward_zero():
    a = np.array([7, -7, 7, -7, 6, -6, 0], dtype=np.int64)
    b = np.array([2, 2, -2, -2, 3, -4, 5], dtype=np.int64)
    expected = check_op("Div", [a, b])
    assert expected[0].tolist() == [3, -3, -3, 3, 2, 1, 0]


@pytest.mark.parametrize(
    ("base", "exponent"),
    [
        (np.abs(normal(3, 4)) + 0.1, normal(3, 4)),
        (normal(3, 4), np.array(2.0, dtype=np.float32)),
        (normal(3, 4), np.array([2, 3, 1, 0], dtype=np.int64)),
        (integers(3, 4, low=-5, high=5), np.array([2, 3, 1, 0], dtype=np.int32)),
        (integers(3, 4, low=0, high=5, dtype="int64"), np.array(2.0, dtype=np.float32)),
    ],
)
def test_pow_keeps_the_base_dtype(base, exponent):
    check_op("Pow", [base, exponent])


@pytest.mark.parametrize("op", ["Min", "Max", "Sum", "Mean"])
@pytest.mark.parametrize("count", [1, 2, 3])
def test_variadic(op, count):
    shapes = [(2, 3, 4), (3, 1), (4,)][:count]
    check_op(op, [normal(*shape) for shape in shapes])


@pytest.mark.parametrize("op", ["Min", "Max"])
def test_variadic_integers(op):
    check_op(op, [integers(3, 4, dtype="int64"), integers(4, dtype="int64")])


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_mod_sign_rules(fmod, dtype):
    b = integers(4, 5, dtype=dtype)
    check_op("Mod", [integers(4, 5, dtype=dtype, low=-50, high=50), np.where(b == 0, 7, b)], {"fmod": fmod})


def test_float_mod_uses_fmod():
    check_op("Mod", [normal(4, 5), normal(5)], {"fmod": 1})


@pytest.mark.parametrize("op", ["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_comparisons_give_bool(op, dtype):
    a = integers(3, 4, low=-3, high=3).astype(dtype)
    check_op(op, [a, integers(4, low=-3, high=3).astype(dtype)])


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logical(op):
    check_op(op, [RNG.random((3, 4)) > 0.5, RNG.random((4,)) > 0.5])


def test_not():
    check_op("Not", [RNG.random((3, 4)) > 0.5])


@pytest.mark.parametrize(("shape_condition", "shape_x", "shape_y"), [((3, 4), (3, 4), (3, 4)), ((4,), (3, 1), ())])
def test_where(shape_condition, shape_x, shape_y):
    check_op("Where", [RNG.random(shape_condition) > 0.5, normal(*shape_x), normal(*shape_y)])


@pytest.mark.parametrize("slope_shape", [(1,), (3, 1, 1), (4,), (2, 3, 5, 4)])
def test_prelu_broadcasts_slope_to_input(slope_shape):
    check_op("PRelu", [normal(2, 3, 5, 4), normal(*slope_shape)])


def test_prelu_rejects_slope_that_would_grow_input():
    with pytest.raises(ShapeError, match="PRelu slope"):
        get_op("PRelu").infer([TensorType((3, 4), "float32"), TensorType((2, 3, 4), "float32")], {})


@pytest.mark.parametrize(
    ("low", "high"),
    [(None, None), (-1.0, None), (None, 0.5), (-0.5, 0.5), (1.0, -1.0)],
)
def test_clip_float(low, high):
    bounds = [None if b is None else np.array(b, dtype=np.float32) for b in (low, high)]
    check_op("Clip", [normal(3, 4), *bounds])


def test_clip_integers():
    check_op("Clip", [integers(3, 4, dtype="int64"), np.array(-5, dtype=np.int64), np.array(6, dtype=np.int64)])


def test_clip_as_old_opset_attributes():
    check_op("Clip", [normal(3, 4)], {"min": -0.5, "max": 0.25}, opset=6)


CASTS = [
    ("float32", "int32"),
    ("float32", "int64"),
    ("float32", "int8"),
    ("float32", "uint8"),
    ("float32", "float16"),
    ("float32", "float64"),
    ("float32", "bool"),
    ("int64", "float32"),
    ("int32", "bool"),
    ("bool", "float32"),
    ("bool", "int64"),
    ("float64", "float32"),
    ("int64", "int32"),
]


def to(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


@pytest.mark.parametrize(("source", "target"), CASTS)
def test_cast(source, target):
    if source == "bool":
        x = RNG.random((3, 4)) > 0.5
    elif source.startswith("float"):
        # stay inside the target's range: out-of-range float -> int casts are undefined in ONNX
        x = (RNG.random((3, 4)) * 100 - (0 if target == "uint8" else 50)).astype(source)
        x[0, :2] = 0
    else:
        x = integers(3, 4, low=-3, high=3, dtype=source)
    check_op("Cast", [x], {"to": to(target)})


def test_cast_truncates_toward_zero():
    x = np.array([-2.7, -1.5, -0.2, 0.2, 1.5, 2.7], dtype=np.float32)
    assert check_op("Cast", [x], {"to": to("int32")})[0].tolist() == [-2, -1, 0, 0, 1, 2]


def test_cast_to_unsupported_dtype_names_it():
    with pytest.raises(UnsupportedOpError, match="uint32"):
        get_op("Cast").infer([TensorType((2,), "float32")], {"to": "uint32"})


def test_cast_like():
    check_op("CastLike", [normal(3, 4), np.zeros(1, dtype=np.int64)])


@pytest.mark.parametrize("outputs", [1, 2])
def test_dropout_in_inference_passes_input_through(outputs):
    check_op("Dropout", [normal(3, 4)], outputs=outputs)


def test_dropout_ignores_ratio_outside_training():
    check_op("Dropout", [normal(3, 4), np.array(0.3, dtype=np.float32), np.array(False)], outputs=2)


def test_dropout_in_training_mode_is_refused():
    attrs = {"ratio": 0.5, "training_mode": True}
    with pytest.raises(UnsupportedOpError, match="training mode"):
        get_op("Dropout").infer([TensorType((2,), "float32")], attrs)


def test_is_nan_and_is_inf():
    x = np.array([1.0, np.nan, np.inf, -np.inf, 0.0], dtype=np.float32)
    check_op("IsNaN", [x])
    check_op("IsInf", [x])
    check_op("IsInf", [x], {"detect_negative": 0})
    check_op("IsInf", [x], {"detect_positive": 0})


def test_broadcast_mismatch_is_a_shape_error():
    with pytest.raises(ShapeError, match="do not broadcast"):
        get_op("Add").infer([TensorType((2, 3), "float32"), TensorType((4,), "float32")], {})


def test_mixed_dtypes_are_a_model_error():
    with pytest.raises(ModelError, match="Cast"):
        get_op("Mul").infer([TensorType((2, 3), "float32"), TensorType((3,), "int64")], {})


@pytest.mark.parametrize(
    ("op", "pattern"),
    [
        ("Relu", Pattern.ELEMWISE),
        ("Cast", Pattern.ELEMWISE),
        ("Identity", Pattern.ELEMWISE),
        ("Dropout", Pattern.ELEMWISE),
        ("Clip", Pattern.ELEMWISE),
        ("Add", Pattern.BROADCAST),
        ("Equal", Pattern.BROADCAST),
        ("Where", Pattern.BROADCAST),
        ("PRelu", Pattern.BROADCAST),
        ("Max", Pattern.BROADCAST),
    ],
)
def test_patterns_follow_the_contract(op, pattern):
    assert get_op(op).pattern_of({}) == pattern
