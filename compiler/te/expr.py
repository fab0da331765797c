"""Scalar expressions: the language of tensor-expression computes, reused unchanged by the loop IR.

`te.compute` bodies build these; `tir/` lowers TE-only nodes (TensorLoad, Reduce) away and adds
buffer loads; every codegen prints what remains.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from compiler.errors import TesselError

DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")
FLOAT_DTYPES = ("float16", "float32", "float64")
INT_DTYPES = ("int8", "uint8", "int16", "int32", "int64")


class TEError(TesselError, ValueError):
    """Misuse of the tensor-expression language or of a schedule; the message says where."""


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    return dtype in INT_DTYPES


def _promote(a: str, b: str) -> str:
    if a == b:
        return a
    order = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
    return max(a, b, key=order.index)


def const(value, dtype: str | None = None) -> Const:
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else "int32" if isinstance(value, int) else "float32"
    return Const(value, dtype)


def as_expr(value, like: str | None = None) -> Expr:
    """Wrap a Python number; an int next to a float expression takes the float's dtype."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return Const(value, "bool")
    if isinstance(value, int):
        return Const(value, like if like is not None and like != "bool" else "int32")
    if isinstance(value, float):
        return Const(value, like if like is not None and is_float(like) else "float32")
    convert = getattr(value, "__tensor_expr__", None)  # a size known at run time (graph/sym.py's Sym)
    if convert is not None:
        return convert()
    raise TEError(f"cannot use {value!r} ({type(value).__name__}) in a tensor expression")


def _binary(op: str, a, b) -> Expr:
    a_is, b_is = isinstance(a, Expr), isinstance(b, Expr)
    if a_is and not b_is:
        b = as_expr(b, a.dtype)
    elif b_is and not a_is:
        a = as_expr(a, b.dtype)
    else:
        a, b = as_expr(a), as_expr(b)
    dtype = _promote(a.dtype, b.dtype)
    a = a if a.dtype == dtype else Cast(dtype, a)
    b = b if b.dtype == dtype else Cast(dtype, b)
    if op in Compare.OPS:
        return Compare(op, a, b)
    return Binary(op, a, b)


class Expr:
    """Base of every scalar expression; nodes compare by identity so they can key dicts."""

    dtype: str

    __hash__ = object.__hash__

    def __add__(self, other):
        return _binary("add", self, other)

    def __radd__(self, other):
        return _binary("add", other, self)

    def __sub__(self, other):
        return _binary("sub", self, other)

    def __rsub__(self, other):
        return _binary("sub", other, self)

    def __mul__(self, other):
        return _binary("mul", self, other)

    def __rmul__(self, other):
        return _binary("mul", other, self)

    def __truediv__(self, other):
        return _binary("div", self, other)

    def __rtruediv__(self, other):
        return _binary("div", other, self)

    def __floordiv__(self, other):
        return _binary("floordiv", self, other)

    def __rfloordiv__(self, other):
        return _binary("floordiv", other, self)

    def __mod__(self, other):
        return _binary("floormod", self, other)

    def __rmod__(self, other):
        return _binary("floormod", other, self)

    def __neg__(self):
        return _binary("sub", as_expr(0, self.dtype), self)

    def __lt__(self, other):
        return _binary("lt", self, other)

    def __le__(self, other):
        return _binary("le", self, other)

    def __gt__(self, other):
        return _binary("gt", self, other)

    def __ge__(self, other):
        return _binary("ge", self, other)

    def __bool__(self):
        raise TEError("a tensor expression has no truth value; use te.all/te.any/te.select instead of and/or/if")

    def astype(self, dtype: str) -> Expr:
        return self if dtype == self.dtype else Cast(dtype, self)


_var_ids = itertools.count()


@dataclass(eq=False)
class Var(Expr):
    name: str
    dtype: str = "int32"
    uid: int = field(default_factory=lambda: next(_var_ids), repr=False)


@dataclass(eq=False)
class SizeVar(Var):
    """A size known only at run time (a model's symbolic dimension), in [low, high]: a kernel reads it from its sizes
    argument (tir/lower.py binds it by name), and buffers are laid out for `high`."""

    low: int = 0
    high: int = 0


@dataclass(eq=False)
class Const(Expr):
    value: int | float | bool
    dtype: str


@dataclass(eq=False)
class Binary(Expr):
    """op in add, sub, mul, div (true division for floats, truncating for ints), floordiv, floormod,
    min, max, pow; both operands already share `dtype`."""

    OPS = ("add", "sub", "mul", "div", "floordiv", "floormod", "min", "max", "pow")
    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:
        return self.a.dtype


@dataclass(eq=False)
class Compare(Expr):
    OPS = ("lt", "le", "gt", "ge", "eq", "ne")
    op: str
    a: Expr
    b: Expr
    dtype = "bool"


@dataclass(eq=False)
class Logical(Expr):
    """op in and, or (two args), not (one arg)."""

    op: str
    args: tuple[Expr, ...]
    dtype = "bool"


@dataclass(eq=False)
class Select(Expr):
    """Both branches may be evaluated; the seeds' padding uses it for out-of-bounds reads, which
    lowering guards by turning loads into `if_then_else` where the index may be out of range."""

    cond: Expr
    true_value: Expr
    false_value: Expr

    @property
    def dtype(self) -> str:
        return self.true_value.dtype


@dataclass(eq=False)
class IfThenElse(Expr):
    """Like Select, but only the taken branch is evaluated."""

    cond: Expr
    true_value: Expr
    false_value: Expr

    @property
    def dtype(self) -> str:
        return self.true_value.dtype


@dataclass(eq=False)
class Cast(Expr):
    dtype: str
    value: Expr


@dataclass(eq=False)
class Call(Expr):
    """A math intrinsic (exp, log, sqrt, rsqrt, tanh, sigmoid, erf, floor, ceil, round, abs, pow);
    index_check(index, extent): the index where it lies in [0, extent), else 0 and the model's run reports
    which call failed (te.index_check); or dot_bytes(a0, a1, a2, a3, word): four uint8 values times the four signed
    bytes of an int32 word, summed (te.dot_bytes)."""

    INTRINSICS = (
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "tanh",
        "sigmoid",
        "erf",
        "floor",
        "ceil",
        "round",
        "abs",
        "pow",
        "index_check",
        "dot_bytes",
    )
    name: str
    args: tuple[Expr, ...]
    dtype: str


@dataclass(eq=False)
class Let(Expr):
    var: Var
    value: Expr
    body: Expr

    @property
    def dtype(self) -> str:
        return self.body.dtype


def largest(extent) -> int:
    """An extent's largest value: an int itself; a size known at run time (a Sym, or an expression of size vars and
    constants, as a split of one makes) with every size var at its `high`. Schedules plan tiles with it."""
    if isinstance(extent, int):
        return extent
    if hasattr(extent, "__tensor_expr__"):
        extent = extent.__tensor_expr__()
    if isinstance(extent, Const):
        return int(extent.value)
    if isinstance(extent, SizeVar):
        return extent.high
    if isinstance(extent, Cast):
        return largest(extent.value)
    if isinstance(extent, Binary) and extent.op in ("add", "mul", "floordiv"):
        a, b = largest(extent.a), largest(extent.b)
        return {"add": a + b, "mul": a * b, "floordiv": a // max(b, 1)}[extent.op]
    raise TEError(f"the extent {extent!r} has no largest value a schedule can plan with")
