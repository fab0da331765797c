"""Elementwise and broadcast ops: their shape rules, fusion patterns and numpy references.

The frontend builds nodes of these ops, the passes fold and fuse them by pattern, and the kernel
stage attaches each one's tensor-expression compute; the references here are the oracle for all.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from compiler.errors import ModelError, ShapeError, UnsupportedOpError
from compiler.graph.ir import DTYPES, TensorType
from compiler.graph.ops.common import broadcast_shapes
from compiler.graph.registry import Pattern, register_op


def _result(array, dtype) -> np.ndarray:
    """`array` as an ndarray of `dtype`: numpy turns 0-d results into scalars and may widen dtypes. Integer arithmetic
    over symbolic sizes (an object array of Syms, folded at import) stays an object array."""
    array = np.asarray(array)
    if array.dtype == object and np.dtype(dtype).kind in "iu":
        return array
    return array.astype(dtype, copy=False)


def _quiet(function):
    """Run a reference with floating-point warnings off: inf and nan are valid ONNX results."""

    @functools.wraps(function)
    def wrapped(*arrays, **attrs):
        with np.errstate(all="ignore"):
            return function(*arrays, **attrs)

    return wrapped


def _same_dtype(types, op: str) -> str:
    dtypes = {t.dtype for t in types if t is not None}
    if len(dtypes) > 1:
        raise ModelError(f"{op} takes inputs of one dtype, got {', '.join(sorted(dtypes))}; insert a Cast")
    return dtypes.pop()


# -- unary ----------------------------------------------------------------------------------------


def _infer_same(types, attrs):
    return [types[0]]


def _register_unary(name: str, function) -> None:
    """`function(x, **attrs)` computes the op; its result is cast back to the input dtype."""

    def reference(x, **attrs):
        return _result(function(x, **attrs), x.dtype)

    register_op(name, infer=_infer_same, pattern=Pattern.ELEMWISE, reference=_quiet(reference))


def _sigmoid(x, **_):
    # exp of -|x| never overflows, and each branch keeps full relative precision in its tail
    decay = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + decay), decay / (1 + decay))


def _erf(x):
    exact = np.vectorize(math.erf, otypes=[np.float64])
    return exact(np.asarray(x, dtype=np.float64)) if x.size else np.zeros(x.shape)


def _relu(x, **_):
    return np.maximum(x, np.zeros((), x.dtype))


def _leaky_relu(x, alpha=0.01, **_):
    return np.where(x < 0, x * x.dtype.type(alpha), x)


def _hard_sigmoid(x, alpha=0.2, beta=0.5, **_):
    return np.clip(x * x.dtype.type(alpha) + x.dtype.type(beta), 0, 1)


def _hard_swish(x, **_):
    return x * np.clip(x * x.dtype.type(1 / 6) + x.dtype.type(0.5), 0, 1)


def _elu(x, alpha=1.0, **_):
    return np.where(x < 0, x.dtype.type(alpha) * np.expm1(x), x)


def _selu(x, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875, **_):
    wide = x.astype(np.float64)
    return gamma * np.where(wide > 0, wide, alpha * np.expm1(wide))


def _celu(x, alpha=1.0, **_):
    wide = x.astype(np.float64)
    return np.maximum(wide, 0) + np.minimum(0, alpha * np.expm1(wide / alpha))


def _thresholded_relu(x, alpha=1.0, **_):
    return np.where(x > x.dtype.type(alpha), x, 0)


def _softplus(x, **_):
    return np.logaddexp(x.dtype.type(0), x)


def _softsign(x, **_):
    return x / (1 + np.abs(x))


def _gelu(x, approximate="none", **_):
    wide = x.astype(np.float64)
    if approximate == "tanh":
        return 0.5 * wide * (1 + np.tanh(math.sqrt(2 / math.pi) * (wide + 0.044715 * wide**3)))
    if approximate != "none":
        raise UnsupportedOpError(f"Gelu approximate={approximate!r} is not supported; use 'none' or 'tanh'")
    return 0.5 * wide * (1 + _erf(wide / math.sqrt(2)))


def _reciprocal(x, **_):
    return np.reciprocal(x) if x.dtype.kind == "f" else 1 / x


_UNARY = {
    "Neg": lambda x, **_: np.negative(x),
    "Abs": lambda x, **_: np.abs(x),
    "Relu": _relu,
    "LeakyRelu": _leaky_relu,
    "Sigmoid": _sigmoid,
    "Tanh": lambda x, **_: np.tanh(x),
    "Exp": lambda x, **_: np.exp(x),
    "Log": lambda x, **_: np.log(x),
    "Sqrt": lambda x, **_: np.sqrt(x),
    "Reciprocal": _reciprocal,
    "Erf": lambda x, **_: _erf(x),
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish,
    "Floor": lambda x, **_: np.floor(x),
    "Ceil": lambda x, **_: np.ceil(x),
    "Round": lambda x, **_: np.round(x),
    "Sign": lambda x, **_: np.sign(x),
    "Softplus": _softplus,
    "Softsign": _softsign,
    "Elu": _elu,
    "Selu": _selu,
    "Celu": _celu,
    "ThresholdedRelu": _thresholded_relu,
    "Gelu": _gelu,
    "Sin": lambda x, **_: np.sin(x),
    "Cos": lambda x, **_: np.cos(x),
    "Not": lambda x, **_: np.logical_not(x),
    "Identity": lambda x, **_: x.copy(),
}
for _name, _function in _UNARY.items():
    _register_unary(_name, _function)


def _infer_is_special(types, attrs):
    return [TensorType(types[0].shape, "bool")]


register_op(
    "IsNaN", infer=_infer_is_special, pattern=Pattern.ELEMWISE, reference=lambda x, **_: _result(np.isnan(x), "bool")
)


def _is_inf(x, detect_negative=1, detect_positive=1, **_):
    return _result(np.isinf(x) & (((x < 0) & bool(detect_negative)) | ((x > 0) & bool(detect_positive))), "bool")


register_op("IsInf", infer=_infer_is_special, pattern=Pattern.ELEMWISE, reference=_is_inf)


# -- Clip, Cast, Dropout --------------------------------------------------------------------------


def _clip(x, min=None, max=None, **_):
    # ONNX clips to max last, so min > max gives max everywhere (as np.minimum(np.maximum(...)) does)
    result = x
    if min is not None:
        result = np.maximum(result, np.asarray(min).astype(x.dtype))
    if max is not None:
        result = np.minimum(result, np.asarray(max).astype(x.dtype))
    return _result(result, x.dtype)


def _infer_clip(types, attrs):
    for bound in ("min", "max"):
        value = attrs.get(bound)
        if isinstance(value, tuple | np.ndarray) and np.size(value) != 1:
            raise ShapeError(f"Clip's {bound} must be a scalar, but it holds {np.size(value)} values")
    return [types[0]]


register_op(
    "Clip",
    infer=_infer_clip,
    pattern=Pattern.ELEMWISE,
    reference=_quiet(_clip),
    const_inputs=((1, "min"), (2, "max")),
)


def _check_dtype(dtype: str, op: str) -> str:
    if dtype not in DTYPES:
        raise UnsupportedOpError(f"{op} to dtype {dtype!r} is not supported; Tessel handles {', '.join(DTYPES)}")
    return dtype


def _infer_cast(types, attrs):
    return [TensorType(types[0].shape, _check_dtype(attrs["to"], "Cast"))]


def _cast(x, to, **_):
    # numpy's float -> int conversion truncates toward zero, as ONNX's does
    return _result(x, _check_dtype(to, "Cast"))


register_op("Cast", infer=_infer_cast, pattern=Pattern.ELEMWISE, reference=_quiet(_cast))


def _infer_cast_like(types, attrs):
    return [TensorType(types[0].shape, types[1].dtype)]


register_op(
    "CastLike",
    infer=_infer_cast_like,
    pattern=Pattern.ELEMWISE,
    reference=_quiet(lambda x, target, **_: _result(x, target.dtype)),
)


def _check_dropout(training_mode, ratio) -> None:
    if training_mode and ratio != 0:
        raise UnsupportedOpError(
            f"Dropout in training mode (ratio {ratio}) is random; export the model in inference mode (model.eval())"
        )


def _infer_dropout(types, attrs):
    _check_dropout(attrs.get("training_mode", 0), attrs.get("ratio", 0.5))
    types = [types[0]]
    if attrs.get("_outputs", 1) > 1:
        types.append(TensorType(types[0].shape, "bool"))
    return types


def _dropout(x, ratio=0.5, training_mode=0, _outputs=1, **_):
    _check_dropout(training_mode, ratio)
    if _outputs > 1:
        return [x.copy(), np.ones(x.shape, dtype=bool)]
    return x.copy()


register_op(
    "Dropout",
    infer=_infer_dropout,
    pattern=Pattern.ELEMWISE,
    reference=_dropout,
    const_inputs=((1, "ratio"), (2, "training_mode")),
)


# -- binary and variadic --------------------------------------------------------------------------


def _infer_broadcast(types, attrs, op: str, dtype: str | None = None):
    present = [t for t in types if t is not None]
    if not present:
        raise ModelError(f"{op} needs at least one input")
    shape = broadcast_shapes(*(t.shape for t in present))
    return [TensorType(shape, dtype or _same_dtype(present, op))]


def _register_broadcast(name: str, function, result_dtype: str | None = None) -> None:
    """`function(*arrays, **attrs)` computes the op on broadcastable inputs; its result gets the
    dtype of the first input, or `result_dtype`."""

    def infer(types, attrs):
        return _infer_broadcast(types, attrs, name, result_dtype)

    def reference(*arrays, **attrs):
        return _result(function(*arrays, **attrs), result_dtype or arrays[0].dtype)

    register_op(name, infer=infer, pattern=Pattern.BROADCAST, reference=_quiet(reference))


def _divide(a, b, **_):
    if a.dtype.kind == "f":
        return a / b
    # ONNX integer division truncates toward zero; numpy's // floors, so step back toward zero
    quotient = a // np.where(b == 0, 1, b)
    inexact = (a % np.where(b == 0, 1, b) != 0) & ((a < 0) != (b < 0))
    return np.where(b == 0, 0, quotient + inexact)


def _power(base, exponent, **_):
    if base.dtype.kind in "iu" and exponent.dtype.kind in "iu" and not np.any(exponent < 0):
        return np.power(base.astype(np.int64), exponent.astype(np.int64))
    return np.power(base.astype(np.float64), exponent.astype(np.float64))


def _mod(a, b, fmod=0, **_):
    if fmod:
        return np.fmod(a, b)
    return np.mod(a, b)


def _mean(*arrays, **_):
    total = arrays[0]
    for array in arrays[1:]:
        total = total + array
    return total / total.dtype.type(len(arrays))


def _variadic(function):
    def reduce(*arrays, **_):
        result = arrays[0].copy()
        for array in arrays[1:]:
            result = function(result, array)
        return result

    return reduce


_BROADCAST = {
    "Add": lambda a, b, **_: a + b,
    "Sub": lambda a, b, **_: a - b,
    "Mul": lambda a, b, **_: a * b,
    "Div": _divide,
    "Mod": _mod,
    "Min": _variadic(np.minimum),
    "Max": _variadic(np.maximum),
    "Sum": _variadic(np.add),
    "Mean": _mean,
    "And": lambda a, b, **_: np.logical_and(a, b),
    "Or": lambda a, b, **_: np.logical_or(a, b),
    "Xor": lambda a, b, **_: np.logical_xor(a, b),
}
for _name, _function in _BROADCAST.items():
    _register_broadcast(_name, _function)

_COMPARISONS = {
    "Equal": np.equal,
    "Greater": np.greater,
    "Less": np.less,
    "GreaterOrEqual": np.greater_equal,
    "LessOrEqual": np.less_equal,
}
for _name, _function in _COMPARISONS.items():
    _register_broadcast(_name, lambda a, b, _compare=_function, **_: _compare(a, b), result_dtype="bool")


def _infer_power(types, attrs):
    return [TensorType(broadcast_shapes(types[0].shape, types[1].shape), types[0].dtype)]


register_op(
    "Pow",
    infer=_infer_power,
    pattern=Pattern.BROADCAST,
    reference=_quiet(lambda base, exponent, **_: _result(_power(base, exponent), base.dtype)),
)


def _infer_where(types, attrs):
    if types[0].dtype != "bool":
        raise ModelError(f"Where takes a bool condition, got {types[0].dtype}; insert a Cast to bool")
    shape = broadcast_shapes(*(t.shape for t in types))
    return [TensorType(shape, _same_dtype(types[1:], "Where"))]


register_op(
    "Where",
    infer=_infer_where,
    pattern=Pattern.BROADCAST,
    reference=lambda condition, x, y, **_: _result(np.where(condition, x, y), x.dtype),
)


def _infer_prelu(types, attrs):
    data, slope = types
    if broadcast_shapes(data.shape, slope.shape) != data.shape:
        raise ShapeError(
            f"PRelu slope of shape {list(slope.shape)} does not broadcast to the input shape {list(data.shape)}"
        )
    return [data]


register_op(
    "PRelu",
    infer=_infer_prelu,
    pattern=Pattern.BROADCAST,
    reference=_quiet(lambda x, slope, **_: _result(np.where(x < 0, x * slope, x), x.dtype)),
)
