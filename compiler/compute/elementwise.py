"""Tensor-expression computes of the elementwise and broadcast ops (compiler/graph/ops/elementwise.py).

Each compute reads its inputs with numpy broadcasting and reproduces the op's numpy reference; the
stages it makes are tagged "elemwise" or "broadcast" so a schedule can inline them into their reader.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from compiler import te
from compiler.compute import tags
from compiler.graph.ir import TensorType
from compiler.graph.registry import Pattern, get_op, set_compute
from compiler.te.expr import Compare, Const, Expr, Logical, is_float

ScalarFn = Callable[..., Expr]


def constant(value, dtype: str) -> Const:
    """A scalar constant of `dtype`, converted as numpy converts `value` to that dtype."""
    converted = np.asarray(value).astype(dtype).item()
    return Const(converted, dtype)


def broadcast_read(tensor: te.Tensor, index: tuple) -> Expr:
    """`tensor` read at the output position `index` under numpy broadcasting (trailing axes aligned)."""
    offset = len(index) - len(tensor.shape)
    return tensor[tuple(0 if dim == 1 else index[offset + k] for k, dim in enumerate(tensor.shape))]


def is_nan(x: Expr) -> Expr:
    return Compare("ne", x, x)


def pointwise(name: str, tag: str, inputs: list[te.Tensor], output: TensorType, scalar: ScalarFn) -> te.Tensor:
    """One stage computing `scalar(*values)` at each output position, its inputs broadcast to it."""

    def body(*index):
        return scalar(*(broadcast_read(tensor, index) for tensor in inputs)).astype(output.dtype)

    return te.compute(output.shape, body, name=name, tag=tag)


def _register(op: str, scalar_of: Callable[[dict, list[te.Tensor], TensorType], ScalarFn]) -> None:
    """Attach a one-stage compute: `scalar_of(attrs, inputs, output_type)` gives the scalar function."""
    tag = tags.ELEMWISE if get_op(op).pattern_of({}) == Pattern.ELEMWISE else tags.BROADCAST

    def compute(inputs, attrs, output_types):
        present = [tensor for tensor in inputs if tensor is not None]
        scalar = scalar_of(attrs, present, output_types[0])
        return [pointwise(op.lower(), tag, present, output_types[0], scalar)]

    set_compute(op, compute)


def _simple(op: str, scalar: ScalarFn) -> None:
    _register(op, lambda attrs, inputs, output: scalar)


def _with_attrs(op: str, scalar: Callable[..., Expr]) -> None:
    """`scalar(x, **attrs)` where float attributes become constants of x's dtype."""
    _register(op, lambda attrs, inputs, output: lambda *values: scalar(*values, **attrs))


def _number(value, like: Expr) -> Const:
    return constant(value, like.dtype)


# -- unary ------------------------------------------------------------------------------------------


def _sign(x):
    zero, one = _number(0, x), _number(1, x)
    sign = te.select(x > zero, one, te.select(x < zero, _number(-1, x) if x.dtype != "uint8" else zero, zero))
    return te.select(is_nan(x), x, sign) if is_float(x.dtype) else sign


def _leaky_relu(x, alpha=0.01, **_):
    return te.select(x < _number(0, x), x * _number(alpha, x), x)


def _clip_unit(x):
    return te.minimum(te.maximum(x, _number(0, x)), _number(1, x))


def _hard_sigmoid(x, alpha=0.2, beta=0.5, **_):
    return _clip_unit(x * _number(alpha, x) + _number(beta, x))


def _hard_swish(x, **_):
    return x * _clip_unit(x * _number(1 / 6, x) + _number(0.5, x))


def _expm1(x):
    return te.exp(x) - _number(1, x)


def _elu(x, alpha=1.0, **_):
    return te.select(x < _number(0, x), _number(alpha, x) * _expm1(x), x)


def _selu(x, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875, **_):
    return _number(gamma, x) * te.select(x > _number(0, x), x, _number(alpha, x) * _expm1(x))


def _celu(x, alpha=1.0, **_):
    zero = _number(0, x)
    return te.maximum(x, zero) + te.minimum(zero, _number(alpha, x) * _expm1(x / _number(alpha, x)))


def _thresholded_relu(x, alpha=1.0, **_):
    return te.select(x > _number(alpha, x), x, _number(0, x))


def _softplus(x, **_):
    # log(1 + e^x) = max(x, 0) + log(1 + e^-|x|): e^-|x| never overflows
    return te.maximum(x, _number(0, x)) + te.log(_number(1, x) + te.exp(-te.abs(x)))


def _gelu(x, approximate="none", **_):
    half = _number(0.5, x)
    if approximate == "tanh":
        inner = _number(math.sqrt(2 / math.pi), x) * (x + _number(0.044715, x) * x * x * x)
        return half * x * (_number(1, x) + te.tanh(inner))
    return half * x * (_number(1, x) + te.erf(x * _number(1 / math.sqrt(2), x)))


def _reciprocal(x):
    if is_float(x.dtype):
        return _number(1, x) / x
    return (Const(1.0, "float64") / x.astype("float64")).astype(x.dtype)


def _sin_cos(name: str):
    """sin or cos (te's calls, expanded per use by tir/fast_math.py: computed in the compute, its operand was written
    out at every read of it, and a rotary embedding's kernel grew to 0.9 MB of LLVM IR); float16 in float32."""
    call = getattr(te, name)

    def compute(x: Expr) -> Expr:
        return call(x.astype("float32")).astype(x.dtype) if x.dtype == "float16" else call(x)

    return compute


_UNARY: dict[str, ScalarFn] = {
    "Neg": lambda x: -x,
    "Abs": te.abs,
    "Relu": lambda x: te.maximum(x, _number(0, x)),
    "Sigmoid": te.sigmoid,
    "Tanh": te.tanh,
    "Exp": te.exp,
    "Log": te.log,
    "Sqrt": te.sqrt,
    "Reciprocal": _reciprocal,
    "Erf": te.erf,
    "Floor": te.floor,
    "Ceil": te.ceil,
    "Round": te.round,
    "Sign": _sign,
    "Softsign": lambda x: x / (_number(1, x) + te.abs(x)),
    "Sin": _sin_cos("sin"),
    "Cos": _sin_cos("cos"),
    "Not": lambda x: Logical("not", (x,)),
    "Identity": lambda x: x,
    "IsNaN": is_nan,
}
for _op, _scalar in _UNARY.items():
    _simple(_op, _scalar)

_UNARY_WITH_ATTRS = {
    "LeakyRelu": _leaky_relu,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish,
    "Elu": _elu,
    "Selu": _selu,
    "Celu": _celu,
    "ThresholdedRelu": _thresholded_relu,
    "Softplus": _softplus,
    "Gelu": _gelu,
}
for _op, _scalar in _UNARY_WITH_ATTRS.items():
    _with_attrs(_op, _scalar)


def _is_inf(x, detect_negative=1, detect_positive=1, **_):
    checks = [Compare("eq", x, _number(-math.inf, x))] if detect_negative else []
    checks += [Compare("eq", x, _number(math.inf, x))] if detect_positive else []
    return te.any(*checks)


_with_attrs("IsInf", _is_inf)


# -- Clip, Cast, Dropout ------------------------------------------------------------------------------


def _clip(x, min=None, max=None, **_):
    # ONNX clips to max last, so min > max gives max everywhere
    if min is not None:
        x = te.maximum(x, constant(min, x.dtype))
    if max is not None:
        x = te.minimum(x, constant(max, x.dtype))
    return x


_with_attrs("Clip", _clip)
_register("Cast", lambda attrs, inputs, output: lambda x: x.astype(output.dtype))


def _cast_like(inputs, attrs, output_types):
    # only the first input is read: the second gives the dtype
    return [
        pointwise("castlike", tags.ELEMWISE, inputs[:1], output_types[0], lambda x: x.astype(output_types[0].dtype))
    ]


set_compute("CastLike", _cast_like)


def _dropout(inputs, attrs, output_types):
    (x, *_) = inputs
    copy = pointwise("dropout", tags.ELEMWISE, [x], output_types[0], lambda value: value)
    if len(output_types) == 1:
        return [copy]
    mask = te.compute(output_types[1].shape, lambda *index: Const(True, "bool"), name="dropout_mask", tag=tags.ELEMWISE)
    return [copy, mask]


set_compute("Dropout", _dropout)


# -- binary and variadic -------------------------------------------------------------------------------


def _divide(a, b):
    if is_float(a.dtype):
        return a / b
    # ONNX integer division truncates toward zero (as the integer "div" does); by zero it gives 0
    zero = Compare("eq", b, _number(0, b))
    return te.select(zero, _number(0, a), a / te.select(zero, _number(1, b), b))


def _mod(a, b, fmod=0, **_):
    if is_float(a.dtype):
        quotient = a / b
        if fmod:
            truncated = te.select(quotient < _number(0, quotient), te.ceil(quotient), te.floor(quotient))
            return a - truncated * b
        return a - te.floor(quotient) * b
    zero = Compare("eq", b, _number(0, b))
    divisor = te.select(zero, _number(1, b), b)
    remainder = a - (a / divisor) * divisor if fmod else a % divisor
    return te.select(zero, _number(0, a), remainder)


def _fold(combine: Callable[[Expr, Expr], Expr]) -> ScalarFn:
    def scalar(*values):
        result = values[0]
        for value in values[1:]:
            result = combine(result, value)
        return result

    return scalar


def _mean(*values):
    return _fold(lambda a, b: a + b)(*values) / _number(len(values), values[0])


def _comparison(op: str) -> ScalarFn:
    return lambda a, b: Compare(op, a, b)


def _power(base: Expr, exponent: Expr) -> Expr:
    """Integer powers stay exact when the float result is rounded: the polynomial pow is within an ulp."""
    if is_float(base.dtype):
        return te.pow(base, exponent.astype(base.dtype))
    wide = te.pow(base.astype("float64"), exponent.astype("float64"))
    if not is_float(exponent.dtype):
        return te.round(wide).astype(base.dtype)
    integral = Compare("eq", te.floor(exponent.astype("float64")), exponent.astype("float64"))
    return te.select(integral, te.round(wide), wide).astype(base.dtype)


_BINARY: dict[str, ScalarFn] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": _divide,
    "Min": _fold(te.minimum),
    "Max": _fold(te.maximum),
    "Sum": _fold(lambda a, b: a + b),
    "Mean": _mean,
    "And": lambda a, b: Logical("and", (a, b)),
    "Or": lambda a, b: Logical("or", (a, b)),
    "Xor": _comparison("ne"),
    "Equal": _comparison("eq"),
    "Greater": _comparison("gt"),
    "Less": _comparison("lt"),
    "GreaterOrEqual": _comparison("ge"),
    "LessOrEqual": _comparison("le"),
    "Pow": _power,
    "Where": lambda condition, x, y: te.select(condition, x, y),
    "PRelu": lambda x, slope: te.select(x < _number(0, x), x * slope, x),
}
for _op, _scalar in _BINARY.items():
    _simple(_op, _scalar)
_with_attrs("Mod", _mod)
