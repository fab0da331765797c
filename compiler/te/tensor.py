"""Tensors and operations of the tensor-expression language: placeholders, computes, reductions.

A compute body is a scalar expression over its axes (IterVars) that reads other tensors through
TensorLoad; `te/schedule.py` decides the loops and `tir/lower.py` turns both into loop IR.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from compiler.te.expr import DTYPES, Const, Expr, TEError, Var, as_expr, is_float, is_int

DATA_PAR = "data_par"
REDUCE = "reduce"
THREAD = "thread"
# The tag of a compute stage that several stages read and that should be made once, into a local buffer where its
# readers run, rather than inlined into each of them (softmax's exp(x - max), read by the sum and the output).
STASH = "stash"
THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z", "vthread")


@dataclass(eq=False)
class IterVar(Var):
    """A loop variable with its domain `dom = (min, extent)` and its kind (data-parallel, reduce,
    thread). It is itself a Var, so compute bodies use it directly, as `i*2 + di`."""

    dom: tuple = (0, 0)
    kind: str = DATA_PAR
    thread_tag: str | None = None

    @property
    def extent(self):
        return self.dom[1]


@dataclass(eq=False)
class TensorLoad(Expr):
    """`tensor[indices]` inside a compute body; lowering replaces it with a buffer Load."""

    tensor: Tensor
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> str:
        return self.tensor.dtype


@dataclass(eq=False)
class Reduce(Expr):
    """`combiner` (sum, max, min) of `source` over `axis`; allowed only as a whole compute body."""

    combiner: str
    source: Expr
    axis: tuple[IterVar, ...]
    identity: Const

    @property
    def dtype(self) -> str:
        return self.source.dtype


class Operation:
    """Base of PlaceholderOp and ComputeOp; compares by identity."""

    name: str
    shape: tuple
    dtype: str

    __hash__ = object.__hash__

    def output(self, index: int = 0) -> Tensor:
        if index != 0:
            raise TEError(f"operation {self.name} has one output; asked for output {index}")
        return self._output

    @property
    def input_tensors(self) -> list[Tensor]:
        return []


@dataclass(eq=False)
class PlaceholderOp(Operation):
    name: str
    shape: tuple
    dtype: str

    def __post_init__(self):
        self._output = Tensor(self)


@dataclass(eq=False)
class ComputeOp(Operation):
    name: str
    tag: str
    axis: tuple[IterVar, ...]
    body: Expr

    def __post_init__(self):
        self._output = Tensor(self)

    @property
    def reduce_axis(self) -> tuple[IterVar, ...]:
        return self.body.axis if isinstance(self.body, Reduce) else ()

    @property
    def shape(self) -> tuple:
        return tuple(iv.extent for iv in self.axis)

    @property
    def dtype(self) -> str:
        return self.body.dtype

    @property
    def input_tensors(self) -> list[Tensor]:
        found: dict[int, Tensor] = {}
        for node in walk(self.body):
            if isinstance(node, TensorLoad):
                found.setdefault(id(node.tensor.op), node.tensor)
        return list(found.values())


class Tensor:
    """The output of an operation; `t[i, j]` reads it inside another compute."""

    __hash__ = object.__hash__

    def __init__(self, op: Operation):
        self.op = op

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def shape(self) -> tuple:
        return self.op.shape

    @property
    def dtype(self) -> str:
        return self.op.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices) -> TensorLoad:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != len(self.shape):
            raise TEError(f"tensor {self.name} has {len(self.shape)} dimensions but was indexed with {len(indices)}")
        converted = []
        for index in indices:
            expr = as_expr(index)
            if not is_int(expr.dtype):
                raise TEError(f"tensor {self.name} indexed with a {expr.dtype} expression; indices must be integers")
            converted.append(expr if expr.dtype == "int32" else expr.astype("int32"))
        return TensorLoad(self, tuple(converted))

    def __repr__(self) -> str:
        return f"Tensor({self.name}, shape={self.shape}, dtype={self.dtype})"


def _check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise TEError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return dtype


def _extent(value, what: str):
    if hasattr(value, "__tensor_expr__"):
        # a size known at run time (graph/sym.py's Sym) stays itself, so a compute's shape arithmetic keeps working on
        # it; it becomes an expression of size vars where loops and indices need one (as_expr)
        if value.__tensor_expr__().dtype != "int32":
            raise TEError(f"{what} must be an int32 size, got {value!r}")
        return value
    if isinstance(value, Const):
        value = value.value
    if (
        isinstance(value, bool)
        or not isinstance(value, int | Expr)
        or (isinstance(value, Expr) and value.dtype != "int32")
    ):
        raise TEError(f"{what} must be an int or an int32 expression of size vars, got {value!r}")
    if isinstance(value, int) and value < 0:
        raise TEError(f"{what} must not be negative, got {value}")
    return value


def placeholder(shape, dtype: str = "float32", name: str = "placeholder") -> Tensor:
    shape = tuple(shape) if isinstance(shape, tuple | list) else (shape,)
    shape = tuple(_extent(extent, f"dimension {k} of placeholder {name}") for k, extent in enumerate(shape))
    return PlaceholderOp(name, shape, _check_dtype(dtype)).output(0)


def compute(shape, fcompute: Callable[..., Expr], name: str = "compute", tag: str = "") -> Tensor:
    shape = tuple(shape) if isinstance(shape, tuple | list) else (shape,)
    shape = tuple(_extent(extent, f"dimension {k} of compute {name}") for k, extent in enumerate(shape))
    names = _axis_names(fcompute, len(shape))
    axis = tuple(IterVar(axis_name, dom=(0, extent)) for axis_name, extent in zip(names, shape))
    body = as_expr(fcompute(*axis))
    for node in walk(body):
        if isinstance(node, Reduce) and node is not body:
            raise TEError(
                f"compute {name}: a reduction must be the whole body (as in te.sum(...)), not part of a larger "
                "expression; compute the reduction in its own stage"
            )
    _check_dtype(body.dtype)
    return ComputeOp(name, tag, axis, body).output(0)


def _axis_names(fcompute, ndim: int) -> list[str]:
    code = getattr(fcompute, "__code__", None)
    if code is not None and code.co_argcount == ndim and not code.co_flags & 0x04:
        return list(code.co_varnames[:ndim])
    return [f"ax{k}" for k in range(ndim)]


def reduce_axis(dom, name: str = "rv") -> IterVar:
    low, high = dom
    low, high = _extent(low, f"lower bound of reduce axis {name}"), _extent(high, f"upper bound of reduce axis {name}")
    extent = high - low if isinstance(low, int) and isinstance(high, int) else high
    if isinstance(low, int) and isinstance(high, int) and high <= low:
        raise TEError(f"reduce axis {name} has an empty range [{low}, {high})")
    return IterVar(name, dom=(low, extent), kind=REDUCE)


def thread_axis(tag: str, name: str | None = None) -> IterVar:
    if tag not in THREAD_TAGS:
        raise TEError(f"unknown thread tag {tag!r}; use one of {', '.join(THREAD_TAGS)}")
    return IterVar(name or tag, dom=(0, 0), kind=THREAD, thread_tag=tag)


def identity_element(combiner: str, dtype: str) -> Const:
    if combiner == "sum":
        return Const(0.0 if is_float(dtype) else False if dtype == "bool" else 0, dtype)
    if dtype == "bool":
        return Const(combiner == "min", dtype)
    if is_float(dtype):
        return Const(-math.inf if combiner == "max" else math.inf, dtype)
    bits = int(dtype.removeprefix("u").removeprefix("int"))
    low, high = (0, 2**bits - 1) if dtype.startswith("u") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return Const(low if combiner == "max" else high, dtype)


def _reducer(combiner: str):
    def reduce(expr, axis) -> Reduce:
        axes = tuple(axis) if isinstance(axis, list | tuple) else (axis,)
        if not axes:
            raise TEError(f"te.{combiner} needs at least one reduce axis")
        for iv in axes:
            if not isinstance(iv, IterVar) or iv.kind != REDUCE:
                raise TEError(
                    f"te.{combiner}: {iv!r} is not a reduce axis; make it with te.reduce_axis((lo, hi), name)"
                )
        expr = as_expr(expr)
        return Reduce(combiner, expr, axes, identity_element(combiner, expr.dtype))

    reduce.__name__ = combiner
    reduce.__doc__ = f"The {combiner} of `expr` over the reduce axes `axis` (one IterVar or a list)."
    return reduce


reduce_sum = _reducer("sum")
reduce_max = _reducer("max")
reduce_min = _reducer("min")


def children(node, kinds: tuple[type, ...] = (Expr,)) -> Iterator:
    """The nodes of `kinds` a node holds directly, in field order (tir/visitor.py adds statements)."""
    for item in dataclasses.fields(node):
        value = getattr(node, item.name)
        if isinstance(value, kinds):
            yield value
        elif isinstance(value, tuple):
            yield from (element for element in value if isinstance(element, kinds))


def walk(expr: Expr) -> Iterator[Expr]:
    """Every node of `expr`, parents before children."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, Var | Const):
            stack.extend(reversed(list(children(node))))


def mutate(expr: Expr, visit: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild `expr` bottom-up; `visit(node)` may return a replacement (then its children are not
    visited) or None to keep descending. Reduce axes are never rewritten."""
    replaced = visit(expr)
    if replaced is not None:
        return replaced
    if isinstance(expr, Var | Const):
        return expr
    changes = {}
    for item in dataclasses.fields(expr):
        value = getattr(expr, item.name)
        if isinstance(value, Expr):
            new = mutate(value, visit)
        elif isinstance(value, tuple) and not (isinstance(expr, Reduce) and item.name == "axis"):
            new = tuple(mutate(element, visit) if isinstance(element, Expr) else element for element in value)
            if all(a is b for a, b in zip(new, value)):
                new = value
        else:
            continue
        if new is not value:
            changes[item.name] = new
    return dataclasses.replace(expr, **changes) if changes else expr


def substitute(expr: Expr, mapping: dict[Var, Expr]) -> Expr:
    if not mapping:
        return expr
    return mutate(expr, lambda node: mapping.get(node) if isinstance(node, Var) else None)
