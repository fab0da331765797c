"""Tensor-expression computes of the reductions (compiler/graph/ops/reduce.py): ReduceX, ArgMax/ArgMin and TopK.

Each reduction is a stage tagged "reduce" (sum, max or min over reduce axes), with elementwise
"elemwise" stages before it folded into its source and after it (mean, log, sqrt, casts) as their own
stages; ReduceProd, which has no combiner, multiplies unrolled chunks in "reduce" stages.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from compiler import te
from compiler.compute import tags
from compiler.compute.elementwise import constant, is_nan
from compiler.graph.ir import TensorType
from compiler.graph.ops.common import normalize_axis
from compiler.graph.ops.reduce import cumsum_axis, einsum_plan, reduced_axes
from compiler.graph.registry import set_compute
from compiler.te.expr import Compare, Const, Expr, Logical, is_float
from compiler.te.tensor import identity_element

# ReduceProd multiplies at most this many elements per output element in one stage
_PRODUCT_CHUNK = 16


def _accumulator(dtype: str, wide_ints: bool = False) -> str:
    """float16 accumulates in float32 (as the references do); ints accumulate in float64 when the
    reference computes in floats."""
    if dtype == "float16":
        return "float32"
    if wide_ints and not is_float(dtype):
        return "float64"
    return dtype


@dataclass(frozen=True)
class _Plan:
    """A reduction: `source(x)` per element in `accumulate` dtype, combined by `combiner`, then
    `finish(total, count)`."""

    combiner: str
    source: Callable[[Expr], Expr]
    finish: Callable[[Expr, int], Expr]
    wide_ints: bool = False


def _same(value, _count):
    return value


def _log(value, _count):
    return te.log(value)


def _mean(value, count):
    return value / constant(count, value.dtype)


_PLANS = {
    "ReduceSum": _Plan("sum", lambda x: x, _same),
    "ReduceMean": _Plan("sum", lambda x: x, _mean, wide_ints=True),
    "ReduceMax": _Plan("max", lambda x: x, _same),
    "ReduceMin": _Plan("min", lambda x: x, _same),
    "ReduceL1": _Plan("sum", te.abs, _same),
    "ReduceL2": _Plan("sum", lambda x: x * x, lambda value, _count: te.sqrt(value), wide_ints=True),
    "ReduceSumSquare": _Plan("sum", lambda x: x * x, _same),
    "ReduceLogSum": _Plan("sum", lambda x: x, _log, wide_ints=True),
}


def _output_index(index: tuple, rank: int, axes: tuple[int, ...], keepdims: int) -> list:
    """The input positions outside `axes` for an output index (keepdims or not), one per input axis;
    reduced axes hold None."""
    position = iter(index)
    result = []
    for axis in range(rank):
        if axis in axes:
            result.append(None)
            if keepdims:
                next(position)
        else:
            result.append(next(position))
    return result


def _reduce_stage(
    x: te.Tensor, axes, keepdims, shape, combiner: str, source: Callable[[Expr], Expr], name: str
) -> te.Tensor:
    reducer = {"sum": te.sum, "max": te.max, "min": te.min}[combiner]

    def body(*index):
        outer = _output_index(index, len(x.shape), axes, keepdims)
        reduce_axes = [te.reduce_axis((0, x.shape[axis]), name=f"k{axis}") for axis in axes]
        rv = iter(reduce_axes)
        full = tuple(next(rv) if position is None else position for position in outer)
        return reducer(source(x[full]), axis=reduce_axes)

    return te.compute(shape, body, name=name, tag=tags.REDUCE)


def _finish_stage(total: te.Tensor, finish, count: int, dtype: str, name: str) -> te.Tensor:
    return te.compute(
        total.shape, lambda *index: finish(total[index], count).astype(dtype), name=f"{name}_finish", tag=tags.ELEMWISE
    )


def _empty_result(op: str, dtype: str) -> float | int:
    """The value of a reduction over no elements, as numpy's reference gives it."""
    if op in ("ReduceMax", "ReduceMin"):
        bound = -math.inf if op == "ReduceMax" else math.inf
        return bound if is_float(dtype) else identity_element(op[6:].lower(), dtype).value
    return {"ReduceMean": math.nan, "ReduceLogSum": -math.inf, "ReduceLogSumExp": -math.inf, "ReduceProd": 1}.get(op, 0)


def _reduction(op: str):
    def compute(inputs, attrs, output_types):
        (x,), (output,) = inputs, output_types
        axes = reduced_axes(len(x.shape), attrs.get("axes"), attrs.get("noop_with_empty_axes", 0))
        keepdims = attrs.get("keepdims", 1)
        name = op.lower()
        count = math.prod(x.shape[axis] for axis in axes)
        if count == 0:
            value = constant(_empty_result(op, output.dtype), output.dtype)
            return [te.compute(output.shape, lambda *index: value, name=name, tag=tags.ELEMWISE)]
        if op == "ReduceLogSumExp":
            return [_log_sum_exp(x, axes, keepdims, output, name)]
        if op == "ReduceProd":
            return [_product(x, axes, keepdims, output, name)]
        plan = _PLANS[op]
        wide = _accumulator(x.dtype, plan.wide_ints)
        if not axes:

            def elementwise(*index):
                return plan.finish(plan.source(x[index].astype(wide)), 1).astype(output.dtype)

            return [te.compute(output.shape, elementwise, name=name, tag=tags.ELEMWISE)]
        needs_finish = wide != output.dtype or plan.finish is not _same
        total = _reduce_stage(
            x, axes, keepdims, output.shape, plan.combiner, lambda value: plan.source(value.astype(wide)), name
        )
        return [_finish_stage(total, plan.finish, count, output.dtype, name) if needs_finish else total]

    return compute


def _log_sum_exp(x: te.Tensor, axes, keepdims, output: TensorType, name: str) -> te.Tensor:
    wide = _accumulator(x.dtype, True)
    if not axes:
        return te.compute(output.shape, lambda *index: x[index], name=name, tag=tags.ELEMWISE)
    peak = _reduce_stage(x, axes, True, _kept_shape(x.shape, axes), "max", lambda v: v.astype(wide), f"{name}_max")

    def shift_at(index):
        value = peak[index]
        finite = te.all(Compare("ne", value, Const(math.inf, wide)), Compare("ne", value, Const(-math.inf, wide)))
        return te.select(te.all(finite, Compare("eq", value, value)), value, Const(0.0, wide))

    def body(*index):
        outer = _output_index(index, len(x.shape), axes, keepdims)
        reduce_axes = [te.reduce_axis((0, x.shape[axis]), name=f"k{axis}") for axis in axes]
        rv = iter(reduce_axes)
        full = tuple(next(rv) if position is None else position for position in outer)
        kept = tuple(Const(0, "int32") if position is None else position for position in outer)
        return te.sum(te.exp(x[full].astype(wide) - shift_at(kept)), axis=reduce_axes)

    total = te.compute(output.shape, body, name=f"{name}_sum", tag=tags.REDUCE)

    def finish(*index):
        outer = _output_index(index, len(x.shape), axes, keepdims)
        kept = tuple(Const(0, "int32") if position is None else position for position in outer)
        return (te.log(total[index]) + shift_at(kept)).astype(output.dtype)

    return te.compute(output.shape, finish, name=f"{name}_finish", tag=tags.ELEMWISE)


def _kept_shape(shape, axes) -> tuple[int, ...]:
    return tuple(1 if axis in axes else dim for axis, dim in enumerate(shape))


def _product(x: te.Tensor, axes, keepdims, output: TensorType, name: str) -> te.Tensor:
    """No product combiner exists, so products of up to _PRODUCT_CHUNK elements are written out as
    multiplications, in stages that each shrink the reduced extent by that factor."""
    wide = _accumulator(x.dtype)
    if not axes:
        return te.compute(output.shape, lambda *index: x[index], name=name, tag=tags.ELEMWISE)
    kept = [axis for axis in range(len(x.shape)) if axis not in axes]
    reduced_dims = [x.shape[axis] for axis in axes]
    count = math.prod(reduced_dims)

    def element(flat: Expr, outer: tuple) -> Expr:
        full = [None] * len(x.shape)
        for axis, position in zip(kept, outer, strict=True):
            full[axis] = position
        remaining = flat
        for axis, dim in reversed(list(zip(axes, reduced_dims, strict=True))):
            full[axis] = remaining % dim
            remaining = remaining // dim
        return x[tuple(full)].astype(wide)

    source, extent, level = element, count, 0
    outer_shape = tuple(x.shape[axis] for axis in kept)
    while True:
        parts = -(-extent // _PRODUCT_CHUNK)
        chunk = min(extent, _PRODUCT_CHUNK)

        def body(*index, source=source, extent=extent, chunk=chunk):
            *outer, part = index
            result = None
            for offset in range(chunk):
                flat = part * chunk + offset
                value = source(flat, tuple(outer))
                if extent % chunk:
                    value = te.if_then_else(flat < extent, value, constant(1, wide))
                result = value if result is None else result * value
            return result

        stage = te.compute((*outer_shape, parts), body, name=f"{name}_part{level}", tag=tags.REDUCE)
        if parts == 1:
            break

        def read_part(flat, outer, stage=stage):
            return stage[(*outer, flat)]

        source, extent, level = read_part, parts, level + 1

    def finish(*index):
        outer = _output_index(index, len(x.shape), axes, keepdims)
        return stage[(*(position for position in outer if position is not None), Const(0, "int32"))].astype(
            output.dtype
        )

    return te.compute(output.shape, finish, name=name, tag=tags.ELEMWISE)


for _op in (*_PLANS, "ReduceLogSumExp", "ReduceProd"):
    set_compute(_op, _reduction(_op))


def _arg(op: str):
    """The first (or last) position of the max (min): a max (min) reduce, then a min (max) reduce
    over positions holding it; NaN counts as the extreme, as numpy's argmax has it."""

    def compute(inputs, attrs, output_types):
        (x,), (output,) = inputs, output_types
        axis = normalize_axis(attrs.get("axis", 0), len(x.shape), f"{op} axis")
        keepdims, last = attrs.get("keepdims", 1), attrs.get("select_last_index", 0)
        extreme = _reduce_stage(
            x,
            (axis,),
            True,
            _kept_shape(x.shape, (axis,)),
            "max" if op == "ArgMax" else "min",
            lambda v: v,
            f"{op.lower()}_value",
        )
        dim = x.shape[axis]

        def body(*index):
            outer = _output_index(index, len(x.shape), (axis,), keepdims)
            k = te.reduce_axis((0, dim), name="k")
            value = x[tuple(k if position is None else position for position in outer)]
            best = extreme[tuple(Const(0, "int32") if position is None else position for position in outer)]
            hit = Compare("eq", value, best)
            if is_float(x.dtype):
                hit = te.select(is_nan(best), is_nan(value), hit)
            position = k.astype("int64")
            if last:
                return te.max(te.select(hit, position, Const(-1, "int64")), axis=k)
            return te.min(te.select(hit, position, Const(dim, "int64")), axis=k)

        return [te.compute(output.shape, body, name=op.lower(), tag=tags.REDUCE)]

    return compute


for _op in ("ArgMax", "ArgMin"):
    set_compute(_op, _arg(_op))


def _topk(inputs, attrs, output_types):
    """Each element's rank along the axis (how many come before it: larger, or smaller for largest=0, or equal
    at a lower position; NaN above every number, as in the reference), then for output position p the position
    whose rank is p, then the values there. The ranks are a reduction over the whole axis per element, so the
    work grows with the square of its length."""
    (x,) = inputs
    values_type, indices_type = output_types
    axis = normalize_axis(attrs.get("axis", -1), len(x.shape), "TopK axis")
    dim, largest = x.shape[axis], attrs.get("largest", 1)

    def above(a: Expr, b: Expr) -> Expr:
        """a comes before b on value alone: larger (smaller with largest=0), a NaN above every number."""
        high, low = (a, b) if largest else (b, a)
        if not is_float(x.dtype):
            return Compare("gt", high, low)
        return te.any(Compare("gt", high, low), te.all(is_nan(high), Logical("not", (is_nan(low),))))

    def tied(a: Expr, b: Expr) -> Expr:
        equal = Compare("eq", a, b)
        return te.any(equal, te.all(is_nan(a), is_nan(b))) if is_float(x.dtype) else equal

    def rank_body(*index):
        j = te.reduce_axis((0, dim), name="j")
        other, mine = x[(*index[:axis], j, *index[axis + 1 :])], x[index]
        first = te.any(above(other, mine), te.all(tied(other, mine), j < index[axis]))
        return te.sum(te.select(first, Const(1, "int32"), Const(0, "int32")), axis=j)

    rank = te.compute(x.shape, rank_body, name="topk_rank", tag=tags.REDUCE)

    def position_body(*index):
        i = te.reduce_axis((0, dim), name="i")
        hit = Compare("eq", rank[(*index[:axis], i, *index[axis + 1 :])], index[axis])
        return te.sum(te.select(hit, i.astype("int64"), Const(0, "int64")), axis=i)

    positions = te.compute(indices_type.shape, position_body, name="topk_indices", tag=tags.REDUCE)

    def value_body(*index):
        return x[(*index[:axis], positions[index].astype("int32"), *index[axis + 1 :])]

    values = te.compute(values_type.shape, value_body, name="topk_values", tag=tags.INJECTIVE)
    return [values, positions]


set_compute("TopK", _topk)


def _cumsum(inputs, attrs, output_types):
    """Each output element a sum over the whole axis of the elements it takes (those before it, or after it with
    reverse; itself unless exclusive), the others read as 0: no scan in TE, so the work grows with the square of the
    axis's length, which is small where exporters write CumSum (position ids over a few hundred tokens)."""
    (x,), (output,) = inputs, output_types
    axis = cumsum_axis(attrs, len(x.shape))
    exclusive, reverse = attrs.get("exclusive", 0), attrs.get("reverse", 0)
    wide = _accumulator(x.dtype)

    def body(*index):
        k = te.reduce_axis((0, x.shape[axis]), name="k")
        position = index[axis]
        if reverse:
            taken = k > position if exclusive else k >= position
        else:
            taken = k < position if exclusive else k <= position
        value = x[(*index[:axis], k, *index[axis + 1 :])].astype(wide)
        return te.sum(te.select(taken, value, constant(0, wide)), axis=k)

    total = te.compute(x.shape, body, name="cumsum", tag=tags.REDUCE)
    if wide == output.dtype:
        return [total]
    return [
        te.compute(x.shape, lambda *index: total[index].astype(output.dtype), name="cumsum_cast", tag=tags.ELEMWISE)
    ]


set_compute("CumSum", _cumsum)


def _einsum(inputs, attrs, output_types):
    """The product of the inputs read at each output element's letters, summed over the letters the output drops
    (one reduce axis each); a letter repeated in a term reads that input's diagonal, and an input's '...' dimensions
    broadcast against the others' from the right. One stage, scheduled as any reduction: an Einsum written as a
    batched matrix product runs as that, not through the matmul templates."""
    (output,) = output_types
    plan = einsum_plan(str(attrs.get("equation", "")), [tuple(tensor.shape) for tensor in inputs])
    wide = _accumulator(output.dtype)
    summed = plan.summed()

    def body(*index):
        places = {letter: te.reduce_axis((0, plan.sizes[letter]), name=f"k_{letter}") for letter in summed}
        reduce_axes = list(places.values())
        if not index and not reduce_axes:
            # a scalar copied ("->"): a reduction of one element, which the GPU templates place where they have no
            # axis of an elementwise stage to bind a thread to
            reduce_axes = [te.reduce_axis((0, 1), name="k")]
        broadcast_index = []
        for letter, place in zip(plan.output, index, strict=True):
            if letter == ".":
                broadcast_index.append(place)
            else:
                places[letter] = place
        product = None
        for tensor, term in zip(inputs, plan.inputs, strict=True):
            # this input's '...' dimensions are the last of the broadcast ones; a dimension of 1 is read at 0
            own = iter(broadcast_index[len(broadcast_index) - term.count(".") :])
            position = []
            for letter, dim in zip(term, tensor.shape, strict=True):
                if letter == ".":
                    place = next(own)
                    position.append(Const(0, "int32") if dim == 1 else place)
                else:
                    position.append(places[letter])
            value = tensor[tuple(position)].astype(wide)
            product = value if product is None else product * value
        return te.sum(product, axis=reduce_axes) if reduce_axes else product

    total = te.compute(
        output.shape, body, name="einsum", tag=tags.REDUCE if summed or not output.shape else tags.ELEMWISE
    )
    if wide == output.dtype:
        return [total]
    return [
        te.compute(
            output.shape, lambda *index: total[index].astype(output.dtype), name="einsum_cast", tag=tags.ELEMWISE
        )
    ]


set_compute("Einsum", _einsum)
