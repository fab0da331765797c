"""Math intrinsics as loop-IR rewrites: a codegen hands its table of native functions to `expand_math` before it
prints a kernel, and every call of erf, tanh, sigmoid, pow, sin or cos that the table lacks becomes arithmetic over the
ones it has (exp, log, abs, floor, round), so every backend computes these to the same accuracy from one copy of the
polynomials (OpenCL C and CUDA take their own sin and cos). Each expansion binds its operand and intermediates once,
per use: written into the computes instead, a rotary embedding's sin and cos repeated their operand at every read of
it (one kernel of a Llama-class decoder: 0.9 MB of LLVM IR). exp and log are native everywhere: WGSL, OpenCL C and
CUDA have them, and codegen/fast_math.py builds LLVM's from bits with the coefficients below."""

from __future__ import annotations

import math
from collections.abc import Collection

from compiler.te.expr import Binary, Call, Cast, Compare, Const, Expr, Let, Select, Var, is_float
from compiler.te.tensor import mutate
from compiler.tir.nodes import Load, Stmt
from compiler.tir.visitor import StmtMutator

# Cephes-style minimax polynomials, highest degree first; accurate to about one float32 ulp.
EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
LOG_POLY = (
    7.0376836292e-2,
    -1.1514610310e-1,
    1.1676998740e-1,
    -1.2420140846e-1,
    1.4249322787e-1,
    -1.6668057665e-1,
    2.0000714765e-1,
    -2.4999993993e-1,
    3.3333331174e-1,
)
TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1)
# erf(x) = x P(x^2) / Q(x^2) for |x| <= ERF_CLAMP, x clamped to that range first: past it erf rounds to +-1 in
# float32. A minimax fit of the absolute error (iterated weighted least squares over a dense grid of [0, 4], made
# for Tessel); highest degree first. One form for every lane: the series below 1 and Abramowitz & Stegun 7.1.26
# (with an exp) above it were both evaluated for every lane and one of them selected. Evaluated in float32 over every
# 2^-14 step of [-5, 5]: max absolute error 2.8e-7 natively (multiply-adds fused), 3.6e-7 in wasm; relative error
# 3.5e-7 below |x| = 1 (tests/codegen/test_llvm_codegen.py).
ERF_P = (
    1.974728775167023e-06,
    0.00028803531313315034,
    0.004003690555691719,
    0.053467631340026855,
    0.1962510049343109,
    1.128378987312317,
)
ERF_Q = (
    3.747947630472481e-05,
    0.0012163566425442696,
    0.015444531105458736,
    0.11647715419530869,
    0.5072540640830994,
    1.0,
)
ERF_CLAMP = 4.0


def _shared(value: Expr, build) -> Expr:
    """`build(x)` with `value` bound once to x, so an expansion that reads its operand many times computes it once."""
    if isinstance(value, Var | Const | Load):
        return build(value)
    var = Var("fm", value.dtype)
    return Let(var, value, build(var))


def _poly(x: Expr, coefficients) -> Expr:
    result = Const(coefficients[0], x.dtype)
    for coefficient in coefficients[1:]:
        result = result * x + Const(coefficient, x.dtype)
    return result


def _call(name: str, *args: Expr) -> Expr:
    return Call(name, tuple(args), args[0].dtype)


def _signed(x: Expr, magnitude: Expr) -> Expr:
    return Select(x < Const(0.0, x.dtype), Const(0.0, x.dtype) - magnitude, magnitude)


def erf(x: Expr) -> Expr:
    def build(x):
        # a select, not min/max, so that NaN stays NaN; +-inf clamp to +-ERF_CLAMP and give +-1
        high, low = Const(ERF_CLAMP, x.dtype), Const(-ERF_CLAMP, x.dtype)
        clamped = Select(x > high, high, Select(x < low, low, x))

        def from_clamped(c):
            return _shared(c * c, lambda s: c * _poly(s, ERF_P) / _poly(s, ERF_Q))

        return _shared(clamped, from_clamped)

    return _shared(x, build)


def tanh(x: Expr) -> Expr:
    def build(x):
        def from_magnitude(m):
            z = x * x
            # x (1 + z p(z)) rather than x + x z p(z), which would turn tanh(-0) into +0
            small = x * (_poly(z, TANH_POLY) * z + Const(1.0, x.dtype))
            large = Const(1.0, x.dtype) - Const(2.0, x.dtype) / (
                _call("exp", m * Const(2.0, x.dtype)) + Const(1.0, x.dtype)
            )
            return Select(m > Const(0.625, x.dtype), _signed(x, large), small)

        return _shared(_call("abs", x), from_magnitude)

    return _shared(x, build)


def sigmoid(x: Expr) -> Expr:
    """e^-|x| keeps both halves accurate: 1/(1+e) for x >= 0 and e/(1+e) for x < 0."""

    def build(x):
        def from_exp(e):
            return _shared(
                Const(1.0, x.dtype) / (e + Const(1.0, x.dtype)),
                lambda positive: Select(x >= Const(0.0, x.dtype), positive, e * positive),
            )

        return _shared(_call("exp", Const(0.0, x.dtype) - _call("abs", x)), from_exp)

    return _shared(x, build)


def pow_(base: Expr, exponent: Expr) -> Expr:
    """exp(y log|x|), negated for x < 0 with odd integer y, NaN for x < 0 with fractional y, 1 for y = 0."""
    dtype = base.dtype

    def build(x, y):
        def with_result(result):
            is_integer = Compare("eq", _call("floor", y), y)
            half = y * Const(0.5, dtype)
            odd = Compare("ne", _call("floor", half), half)
            negative = Select(is_integer, Select(odd, Const(0.0, dtype) - result, result), Const(math.nan, dtype))
            signed = Select(x < Const(0.0, dtype), negative, result)
            return Select(Compare("eq", y, Const(0.0, dtype)), Const(1.0, dtype), signed)

        return _shared(_call("exp", y * _call("log", _call("abs", x))), with_result)

    return _shared(base, lambda x: _shared(exponent, lambda y: build(x, y)))


# sin and cos: Cody-Waite reduction by multiples k of pi/2 (k * HALF_PI_HIGH is exact for the k a float32 argument
# reaches in practice) to |r| <= pi/4, then the sine or cosine polynomial of r and the sign by k mod 4
HALF_PI_HIGH, HALF_PI_MIDDLE, HALF_PI_LOW = 1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8
SIN_POLY = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)
COS_POLY = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)


def _sin_cos(x: Expr, shift: int) -> Expr:
    """sin(x) (shift 0) or cos(x) (shift 1, as sin(x + pi/2)), each intermediate bound once (_shared)."""
    dtype = x.dtype

    def reduce(x, quadrant):
        reduced = x - quadrant * Const(HALF_PI_HIGH, dtype)
        reduced = reduced - quadrant * Const(HALF_PI_MIDDLE, dtype)
        return _shared(reduced - quadrant * Const(HALF_PI_LOW, dtype), lambda r: from_reduced(r, quadrant))

    def from_reduced(r, quadrant):
        def from_square(z):
            sine = r + r * z * _poly(z, SIN_POLY)
            cosine = Const(1.0, dtype) - Const(0.5, dtype) * z + z * z * _poly(z, COS_POLY)
            turn = Binary("floormod", Cast("int32", quadrant) + Const(shift, "int32"), Const(4, "int32"))
            return _shared(
                turn,
                lambda t: _shared(
                    Select(Compare("eq", Binary("floormod", t, Const(2, "int32")), Const(0, "int32")), sine, cosine),
                    lambda value: Select(t >= Const(2, "int32"), Const(0.0, dtype) - value, value),
                ),
            )

        return _shared(r * r, from_square)

    return _shared(x, lambda x: _shared(_call("round", x * Const(2 / math.pi, dtype)), lambda k: reduce(x, k)))


def sin(x: Expr) -> Expr:
    return _sin_cos(x, 0)


def cos(x: Expr) -> Expr:
    return _sin_cos(x, 1)


_EXPANSIONS = {"erf": erf, "tanh": tanh, "sigmoid": sigmoid, "pow": pow_, "sin": sin, "cos": cos}


def _native(name: str, dtype: str, native: Collection[str]) -> bool:
    return name in native or f"{name}:{dtype}" in native


def expand_expr(expr: Expr, native: Collection[str]) -> Expr:
    """`expr` with every float call of erf, tanh, sigmoid, pow, sin or cos that `native` lacks expanded. An entry of `native`
    is a function name (native for every dtype) or "name:dtype" (a C library's float64 erf, more accurate than these
    float32 polynomials). An integer pow is a float32 pow rounded to even, on every target."""

    def visit(node: Expr) -> Expr | None:
        if isinstance(node, Binary) and node.op == "pow":
            a, b = expand_expr(node.a, native), expand_expr(node.b, native)
            if not is_float(node.dtype):
                power = Binary("pow", Cast("float32", a), Cast("float32", b))
                return Cast(node.dtype, Call("round", (expand_expr(power, native),), "float32"))
            return pow_(a, b) if not _native("pow", node.dtype, native) else Binary("pow", a, b)
        if isinstance(node, Call) and node.name in _EXPANSIONS and is_float(node.dtype):
            args = [expand_expr(arg, native) for arg in node.args]
            if _native(node.name, node.dtype, native):
                return Call(node.name, tuple(args), node.dtype)
            return expand_expr(_EXPANSIONS[node.name](*args), native)
        return None

    return mutate(expr, visit)


class _ExpandMath(StmtMutator):
    """Every expression of a statement, expanded as `expand_expr` does."""

    def __init__(self, native: Collection[str]):
        self.native = native

    def visit_expr(self, expr: Expr) -> Expr:
        return expand_expr(expr, self.native)


def expand_math(stmt: Stmt, native: Collection[str]) -> Stmt:
    """`stmt` with every expression expanded as `expand_expr` does."""
    return _ExpandMath(native).visit(stmt)
