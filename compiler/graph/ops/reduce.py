"""Reductions (ReduceX, ArgMax/ArgMin), TopK, CumSum and Einsum: their shape rules, REDUCE pattern and numpy
references.

Axes arrive as the `axes` attribute (the frontend moves the constant input there); the fusion pass
lets a reduction absorb its injective producers, and the kernel stage attaches each compute.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from compiler.errors import ShapeError
from compiler.graph.ir import TensorType
from compiler.graph.ops.common import broadcast_shapes, normalize_axes, normalize_axis
from compiler.graph.registry import Pattern, register_op


def reduced_axes(rank: int, axes=None, noop_with_empty_axes: int = 0) -> tuple[int, ...]:
    """The axes a ReduceX node reduces: all of them when `axes` is absent or empty, unless
    `noop_with_empty_axes` makes that a no-op (an empty tuple)."""
    if axes is None:
        axes = ()
    elif np.ndim(axes) == 0:
        axes = (int(axes),)
    axes = tuple(int(axis) for axis in axes)
    if not axes:
        return () if noop_with_empty_axes else tuple(range(rank))
    return tuple(sorted(normalize_axes(axes, rank)))


def _reduced_shape(shape, axes, keepdims) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if axis in axes else dim for axis, dim in enumerate(shape))
    return tuple(dim for axis, dim in enumerate(shape) if axis not in axes)


def _lowest(dtype: np.dtype):
    if dtype.kind == "f":
        return -np.inf
    if dtype.kind == "b":
        return False
    return np.iinfo(dtype).min


def _highest(dtype: np.dtype):
    if dtype.kind == "f":
        return np.inf
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max


def _accumulator(dtype: np.dtype):
    """float16 sums lose precision in float16 itself, so they accumulate in float32."""
    return np.float32 if dtype == np.float16 else None


def _sum(x, axes):
    return np.sum(x, axis=axes, keepdims=True, dtype=_accumulator(x.dtype))


def _log_sum_exp(x, axes):
    wide = x.astype(np.float64)
    peak = np.max(wide, axis=axes, keepdims=True, initial=-np.inf)
    # shift by the max so exp never overflows; an all -inf (or empty) slice keeps shift 0
    shift = np.where(np.isfinite(peak), peak, 0)
    return np.log(np.sum(np.exp(wide - shift), axis=axes, keepdims=True)) + shift


_REDUCTIONS = {
    "ReduceSum": _sum,
    "ReduceMean": lambda x, axes: np.mean(
        x, axis=axes, keepdims=True, dtype=np.float64 if x.dtype.kind != "f" else None
    ),
    "ReduceMax": lambda x, axes: np.max(x, axis=axes, keepdims=True, initial=_lowest(x.dtype)),
    "ReduceMin": lambda x, axes: np.min(x, axis=axes, keepdims=True, initial=_highest(x.dtype)),
    "ReduceProd": lambda x, axes: np.prod(x, axis=axes, keepdims=True, dtype=_accumulator(x.dtype)),
    "ReduceL1": lambda x, axes: _sum(np.abs(x), axes),
    "ReduceL2": lambda x, axes: np.sqrt(np.sum(np.square(x.astype(np.float64)), axis=axes, keepdims=True)),
    "ReduceSumSquare": lambda x, axes: _sum(np.square(x), axes),
    "ReduceLogSum": lambda x, axes: np.log(_sum(x, axes)),
    "ReduceLogSumExp": _log_sum_exp,
}


def _register_reduction(name: str, function) -> None:
    """`function(x, axes)` reduces over a tuple of axes, keeping them as size-1 dims."""

    def infer(types, attrs):
        (data,) = types
        axes = reduced_axes(len(data.shape), attrs.get("axes"), attrs.get("noop_with_empty_axes", 0))
        return [TensorType(_reduced_shape(data.shape, axes, attrs.get("keepdims", 1)), data.dtype)]

    def reference(x, axes=None, keepdims=1, noop_with_empty_axes=0, **_):
        # no axes (noop_with_empty_axes) still applies the elementwise part: ReduceSumSquare squares
        axes = reduced_axes(x.ndim, axes, noop_with_empty_axes)
        with np.errstate(all="ignore"):
            result = function(x, axes)
        return np.asarray(result).astype(x.dtype, copy=False).reshape(_reduced_shape(x.shape, axes, keepdims))

    register_op(name, infer=infer, pattern=Pattern.REDUCE, reference=reference, const_inputs=((1, "axes"),))


for _name, _function in _REDUCTIONS.items():
    _register_reduction(_name, _function)


def _register_arg(name: str, function) -> None:
    def infer(types, attrs):
        (data,) = types
        rank = len(data.shape)
        axis = normalize_axis(attrs.get("axis", 0), rank, f"{name} axis")
        if data.shape[axis] == 0:
            raise ShapeError(f"{name} over an empty axis {axis} of shape {list(data.shape)} has no answer")
        return [TensorType(_reduced_shape(data.shape, (axis,), attrs.get("keepdims", 1)), "int64")]

    def reference(x, axis=0, keepdims=1, select_last_index=0, **_):
        axis = normalize_axis(axis, x.ndim, f"{name} axis")
        if select_last_index:
            # the first hit in the reversed axis is the last hit in the original
            index = x.shape[axis] - 1 - function(np.flip(x, axis), axis=axis, keepdims=True)
        else:
            index = function(x, axis=axis, keepdims=True)
        return np.asarray(index, dtype=np.int64).reshape(_reduced_shape(x.shape, (axis,), keepdims))

    register_op(name, infer=infer, pattern=Pattern.REDUCE, reference=reference)


_register_arg("ArgMax", np.argmax)
_register_arg("ArgMin", np.argmin)


def topk_count(attrs, dim: int) -> int:
    """TopK's k: the attribute of opset 1, or the constant input of opset 10+ (a one-element tensor), checked
    against the axis it selects from."""
    k = attrs.get("k")
    if k is None:
        raise ShapeError("TopK needs k (its second input) as a constant; give the model a constant k")
    values = np.asarray(k).reshape(-1)
    if values.size != 1:
        raise ShapeError(f"TopK's k must hold one value, got {values.size}")
    k = int(values[0])
    if not 0 <= k <= dim:
        raise ShapeError(f"TopK's k is {k}, but the axis it selects from has {dim} elements")
    return k


def _topk_infer(types, attrs):
    (data,) = types
    axis = normalize_axis(attrs.get("axis", -1), len(data.shape), "TopK axis")
    k = topk_count(attrs, data.shape[axis])
    shape = tuple(k if position == axis else dim for position, dim in enumerate(data.shape))
    return [TensorType(shape, data.dtype), TensorType(shape, "int64")]


def _topk(x, k=None, axis=-1, largest=1, sorted=1, **_):  # noqa: A002 (ONNX's attribute name)
    """The k largest (smallest) along `axis`, in order (whatever `sorted` says), ties to the lower index, NaN
    above every number (numpy's sort order, as the ONNX reference has it)."""
    axis = normalize_axis(axis, x.ndim, "TopK axis")
    count = topk_count({"k": k}, x.shape[axis])
    positions = np.indices(x.shape)[axis]
    # lexsort orders by its last key, then the one before: ascending values, ties by ascending position; for the
    # largest, by descending position, so that reversing the whole order gives the lower position first
    order = np.lexsort((-positions if largest else positions, x), axis=axis)
    if largest:
        order = np.flip(order, axis=axis)
    indices = np.take(order, np.arange(count), axis=axis)
    return [np.take_along_axis(x, indices, axis=axis), indices.astype(np.int64)]


register_op("TopK", infer=_topk_infer, pattern=Pattern.REDUCE, reference=_topk, const_inputs=((1, "k"),))


def cumsum_axis(attrs, rank: int) -> int:
    """CumSum's axis: its second input, a constant holding one value, normalised for a tensor of `rank`."""
    axis = attrs.get("axis")
    if axis is None:
        raise ShapeError("CumSum needs its axis (its second input) as a constant; give the model a constant axis")
    values = np.asarray(axis).reshape(-1)
    if values.size != 1:
        raise ShapeError(f"CumSum's axis must hold one value, got {values.size}")
    return normalize_axis(int(values[0]), rank, "CumSum axis")


def _cumsum_infer(types, attrs):
    (data,) = types
    cumsum_axis(attrs, len(data.shape))
    return [data]


def _cumsum(x, axis=None, exclusive=0, reverse=0, **_):
    """Running sums along `axis`: from the end with `reverse`, each leaving its own element out with `exclusive`."""
    axis = cumsum_axis({"axis": axis}, x.ndim)
    source = np.flip(x, axis) if reverse else x
    total = np.cumsum(source, axis=axis, dtype=_accumulator(x.dtype) or x.dtype)
    if exclusive:
        # each position takes the sum before it: shift the running sums one place along the axis, 0 first
        before = np.zeros_like(np.take(total, [0], axis=axis))
        total = np.concatenate([before, np.take(total, np.arange(x.shape[axis] - 1), axis=axis)], axis=axis)
    return np.ascontiguousarray(np.flip(total, axis) if reverse else total).astype(x.dtype)


register_op("CumSum", infer=_cumsum_infer, pattern=Pattern.REDUCE, reference=_cumsum, const_inputs=((1, "axis"),))


@dataclass(frozen=True)
class EinsumPlan:
    """An Einsum equation resolved against its inputs' shapes: each input's subscripts and the output's, with "."
    standing for the ellipsis's broadcast dimensions (in `broadcast`), and the size of every letter."""

    inputs: tuple[str, ...]
    output: str
    sizes: dict[str, int]
    broadcast: tuple[int, ...]

    def summed(self) -> list[str]:
        """The letters no output dimension keeps, each summed over once."""
        return sorted({letter for term in self.inputs for letter in term} - set(self.output) - {"."})


def einsum_plan(equation: str, shapes: list[tuple[int, ...]]) -> EinsumPlan:
    """Parse `equation` (numpy's notation: letters, at most one "..." a term, "->" and the output, or the implicit
    output of the letters met once, in alphabetical order, after the ellipsis) for inputs of `shapes`."""
    text = equation.replace(" ", "")
    left, arrow, right = text.partition("->")
    terms = left.split(",")
    if len(terms) != len(shapes):
        raise ShapeError(f"Einsum equation {equation!r} names {len(terms)} inputs, the node has {len(shapes)}")
    sizes: dict[str, int] = {}
    broadcast: tuple[int, ...] = ()
    inputs = []
    for term, shape in zip(terms, shapes, strict=True):
        letters = term.replace("...", "")
        if not letters.isalpha() and letters or term.count("...") > 1 or "." in letters:
            raise ShapeError(f"Einsum term {term!r} of {equation!r} may hold letters and one '...', nothing else")
        extra = len(shape) - len(letters)
        if extra < 0 or (extra and "..." not in term):
            raise ShapeError(f"Einsum term {term!r} of {equation!r} does not fit an input of shape {list(shape)}")
        head = term.index("...") if "..." in term else len(letters)
        broadcast = broadcast_shapes(broadcast, shape[head : head + extra])
        inputs.append(letters[:head] + "." * extra + letters[head:])
        for letter, dim in zip(inputs[-1], shape, strict=True):
            if letter != "." and sizes.setdefault(letter, dim) != dim:
                raise ShapeError(f"Einsum subscript {letter!r} of {equation!r} is {sizes[letter]} and {dim} long")
    if arrow:
        letters = right.replace("...", "")
        if not letters.isalpha() and letters or len(set(letters)) != len(letters) or set(letters) - set(sizes):
            raise ShapeError(f"Einsum output {right!r} of {equation!r} must name input letters once each")
        if "..." not in right and broadcast:
            raise ShapeError(f"Einsum output {right!r} of {equation!r} drops the '...' dimensions; keep them")
        head = right.index("...") if "..." in right else len(letters)
        output = letters[:head] + ("." * len(broadcast) if "..." in right else "") + letters[head:]
    else:
        counts = Counter(letter for term in inputs for letter in term if letter != ".")
        output = "." * len(broadcast) + "".join(sorted(letter for letter, count in counts.items() if count == 1))
    return EinsumPlan(tuple(inputs), output, sizes, broadcast)


def einsum_output_shape(plan: EinsumPlan) -> tuple[int, ...]:
    dims = iter(plan.broadcast)
    return tuple(next(dims) if letter == "." else plan.sizes[letter] for letter in plan.output)


def _einsum_infer(types, attrs):
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise ShapeError(f"Einsum inputs must share one dtype, got {sorted(dtypes)}")
    plan = einsum_plan(str(attrs.get("equation", "")), [t.shape for t in types])
    return [TensorType(einsum_output_shape(plan), types[0].dtype)]


def _einsum(*arrays, equation="", **_):
    einsum_plan(str(equation), [array.shape for array in arrays])
    dtype = arrays[0].dtype
    wide = _accumulator(dtype) or dtype
    return np.asarray(np.einsum(str(equation), *(array.astype(wide) for array in arrays))).astype(dtype)


register_op("Einsum", infer=_einsum_infer, pattern=Pattern.REDUCE, reference=_einsum)
