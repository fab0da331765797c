"""Tensor-expression computes of the normalisations and softmax (graph/ops/norm.py): moments in two reductions,
a stash stage made once for the readers of softmax's exponentials."""

from __future__ import annotations

import math
from typing import Any

import compiler.te as te
from compiler.compute import tags
from compiler.compute.pool import pool_power, root
from compiler.compute.support import Inputs, accumulator, clamp
from compiler.graph.ir import TensorType
from compiler.graph.ops.common import normalize_axes, normalize_axis
from compiler.graph.ops.norm import stash_dtype
from compiler.graph.registry import set_compute
from compiler.te.tensor import STASH


def _channel(tensor: te.Tensor, c, dtype: str):
    return tensor[c].astype(dtype)


def batch_norm(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    x, scale, bias, mean, variance = inputs[:5]
    epsilon = float(attrs.get("epsilon", 1e-5))
    acc = accumulator(x.dtype)

    def body(n, c, *rest):
        value = x[(n, c, *rest)].astype(acc) - _channel(mean, c, acc)
        value = value / te.sqrt(_channel(variance, c, acc) + epsilon)
        return (value * _channel(scale, c, acc) + _channel(bias, c, acc)).astype(x.dtype)

    return [te.compute(x.shape, body, name="batch_norm", tag=tags.BROADCAST)]


def _moments(x: te.Tensor, axes: tuple[int, ...], dtype: str, name: str):
    """Mean and variance of `x` over `axes`, kept as size-1 axes: two reductions (mean first, then the centred
    squares, which is how the reference computes it and stays accurate)."""
    shape = tuple(1 if d in axes else size for d, size in enumerate(x.shape))
    count = float(math.prod(x.shape[d] for d in axes))

    def reader(index, reduce_vars):
        iterator = iter(reduce_vars)
        return tuple(next(iterator) if d in axes else index[d] for d in range(x.ndim))

    def reduce_vars():
        return [te.reduce_axis((0, x.shape[d]), f"r{d}") for d in axes]

    first = reduce_vars()
    sums = te.compute(
        shape, lambda *i: te.sum(x[reader(i, first)].astype(dtype), axis=first), name=f"{name}_sum", tag=tags.REDUCE
    )
    mean = te.compute(shape, lambda *i: sums[i] / count, name=f"{name}_mean", tag=tags.ELEMWISE)
    second = reduce_vars()

    def squares(*i):
        centred = x[reader(i, second)].astype(dtype) - mean[i]
        return te.sum(centred * centred, axis=second)

    squared = te.compute(shape, squares, name=f"{name}_squares", tag=tags.REDUCE)
    variance = te.compute(shape, lambda *i: squared[i] / count, name=f"{name}_variance", tag=tags.ELEMWISE)
    return mean, variance


def _kept(index, axes):
    return tuple(0 if d in axes else value for d, value in enumerate(index))


def layer_norm(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    x, scale, bias = (list(inputs) + [None])[:3]
    axis = normalize_axis(attrs.get("axis", -1), x.ndim, "LayerNormalization axis")
    epsilon = float(attrs.get("epsilon", 1e-5))
    stash = stash_dtype(x.dtype)
    axes = tuple(range(axis, x.ndim))
    mean, variance = _moments(x, axes, stash, "layer_norm")
    inverse = te.compute(
        mean.shape, lambda *i: 1.0 / te.sqrt(variance[i] + epsilon), name="inverse_std", tag=tags.ELEMWISE
    )

    def trailing(tensor, index):
        own = index[x.ndim - tensor.ndim :]
        return tensor[tuple(0 if tensor.shape[d] == 1 else own[d] for d in range(tensor.ndim))].astype(stash)

    def body(*i):
        value = (x[i].astype(stash) - mean[_kept(i, axes)]) * inverse[_kept(i, axes)] * trailing(scale, i)
        if bias is not None:
            value = value + trailing(bias, i)
        return value.astype(x.dtype)

    result = te.compute(x.shape, body, name="layer_norm", tag=tags.LAYER_NORM)
    return [result, mean, inverse][: len(output_types)]


def instance_norm(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    x, scale, bias = inputs[:3]
    epsilon = float(attrs.get("epsilon", 1e-5))
    acc = accumulator(x.dtype)
    axes = tuple(range(2, x.ndim))
    mean, variance = _moments(x, axes, acc, "instance_norm")

    def body(*i):
        kept = _kept(i, axes)
        value = (x[i].astype(acc) - mean[kept]) / te.sqrt(variance[kept] + epsilon)
        return (value * _channel(scale, i[1], acc) + _channel(bias, i[1], acc)).astype(x.dtype)

    return [te.compute(x.shape, body, name="instance_norm", tag=tags.LAYER_NORM)]


def group_norm(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    x, scale, bias = inputs[:3]
    groups = int(attrs["num_groups"])
    epsilon = float(attrs.get("epsilon", 1e-5))
    stash = stash_dtype(x.dtype)
    batch, channels, spatial = x.shape[0], x.shape[1], x.shape[2:]
    per_group = channels // groups
    count = float(per_group * math.prod(spatial))

    def reduce_vars():
        return [te.reduce_axis((0, per_group), "rc"), *(te.reduce_axis((0, s), f"r{d}") for d, s in enumerate(spatial))]

    def member(n, g, axes):
        return x[(n, g * per_group + axes[0], *axes[1:])].astype(stash)

    first = reduce_vars()
    sums = te.compute(
        (batch, groups), lambda n, g: te.sum(member(n, g, first), axis=first), name="group_sum", tag=tags.REDUCE
    )
    mean = te.compute((batch, groups), lambda n, g: sums[n, g] / count, name="group_mean", tag=tags.ELEMWISE)
    second = reduce_vars()

    def squares(n, g):
        centred = member(n, g, second) - mean[n, g]
        return te.sum(centred * centred, axis=second)

    squared = te.compute((batch, groups), squares, name="group_squares", tag=tags.REDUCE)

    def per_channel(tensor, c):
        return tensor[c if tensor.shape[0] == channels else c // per_group].astype(stash)

    def body(n, c, *rest):
        g = c // per_group
        value = (x[(n, c, *rest)].astype(stash) - mean[n, g]) / te.sqrt(squared[n, g] / count + epsilon)
        return (value * per_channel(scale, c) + per_channel(bias, c)).astype(x.dtype)

    return [te.compute(x.shape, body, name="group_norm", tag=tags.LAYER_NORM)]


def mean_variance_norm(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    (x,) = inputs[:1]
    axes = tuple(normalize_axes(attrs.get("axes", (0, 2, 3)), x.ndim))
    acc = accumulator(x.dtype)
    shape = tuple(1 if d in axes else size for d, size in enumerate(x.shape))
    count = float(math.prod(x.shape[d] for d in axes))

    def moment(power: int, name: str):
        axis_vars = [te.reduce_axis((0, x.shape[d]), f"r{d}") for d in axes]

        def body(*index):
            iterator = iter(axis_vars)
            value = x[tuple(next(iterator) if d in axes else index[d] for d in range(x.ndim))].astype(acc)
            return te.sum(value * value if power == 2 else value, axis=axis_vars)

        return te.compute(shape, body, name=name, tag=tags.REDUCE)

    sums, squares = moment(1, "mvn_sum"), moment(2, "mvn_squares")

    def body(*i):
        kept = _kept(i, axes)
        mean = sums[kept] / count
        # E[x^2] - E[x]^2 as ONNX defines it, clamped at 0 against rounding
        variance = te.maximum(squares[kept] / count - mean * mean, 0.0)
        return ((x[i].astype(acc) - mean) / (te.sqrt(variance) + 1e-9)).astype(x.dtype)

    return [te.compute(x.shape, body, name="mean_variance_norm", tag=tags.LAYER_NORM)]


def lp_norm(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    (x,) = inputs[:1]
    axis = normalize_axis(attrs.get("axis", -1), x.ndim, "LpNormalization axis")
    p = int(attrs.get("p", 2))
    acc = accumulator(x.dtype)
    shape = tuple(1 if d == axis else size for d, size in enumerate(x.shape))
    k = te.reduce_axis((0, x.shape[axis]), "k")

    def sums(*index):
        return te.sum(pool_power(x[tuple(k if d == axis else v for d, v in enumerate(index))].astype(acc), p), axis=k)

    total = te.compute(shape, sums, name="lp_norm_sum", tag=tags.REDUCE)

    def body(*i):
        norm = root(total[_kept(i, (axis,))], p)
        zero = te.Compare("eq", norm, te.const(0.0, acc))
        return te.select(zero, te.const(0.0, acc), x[i].astype(acc) / te.select(zero, 1.0, norm)).astype(x.dtype)

    return [te.compute(x.shape, body, name="lp_norm", tag=tags.LAYER_NORM)]


def lrn(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    (x,) = inputs[:1]
    size = int(attrs["size"])
    alpha, beta, bias = float(attrs.get("alpha", 1e-4)), float(attrs.get("beta", 0.75)), float(attrs.get("bias", 1.0))
    acc = accumulator(x.dtype)
    before = (size - 1) // 2
    channels = x.shape[1]
    window = te.reduce_axis((0, size), "rc")

    def sums(n, c, *rest):
        source = c - before + window
        value = x[(n, clamp(source, 0, channels - 1), *rest)].astype(acc)
        inside = te.all(source >= 0, source < channels)
        return te.sum(te.select(inside, value * value, 0.0), axis=window)

    total = te.compute(x.shape, sums, name="lrn_sum", tag=tags.REDUCE)

    def body(*i):
        denominator = te.pow(total[i] * (alpha / size) + bias, beta)
        return (x[i].astype(acc) / denominator).astype(x.dtype)

    return [te.compute(x.shape, body, name="lrn", tag=tags.ELEMWISE)]


def _softmax(logarithm: bool):
    def compute(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
        (x,) = inputs[:1]
        axis = normalize_axis(attrs.get("axis", -1), x.ndim, "Softmax axis")
        acc = accumulator(x.dtype)
        shape = tuple(1 if d == axis else size for d, size in enumerate(x.shape))
        first = te.reduce_axis((0, x.shape[axis]), "k")

        def at(index, k):
            return tuple(k if d == axis else value for d, value in enumerate(index))

        largest = te.compute(
            shape, lambda *i: te.max(x[at(i, first)].astype(acc), axis=first), name="softmax_max", tag=tags.REDUCE
        )
        second = te.reduce_axis((0, x.shape[axis]), "k")
        if logarithm:
            # the output needs no exp: exp(x - max) is made once, inside the sum
            def exp_sum(*i):
                return te.sum(te.exp(x[at(i, second)].astype(acc) - largest[i]), axis=second)

            total = te.compute(shape, exp_sum, name="softmax_sum", tag=tags.REDUCE)
        else:
            # exp(x - max) is read by the sum and by the output: a STASH stage, made once per row (schedules keep
            # it in a local buffer) instead of being computed twice
            exponentials = te.compute(
                x.shape, lambda *i: te.exp(x[i].astype(acc) - largest[at(i, 0)]), name="softmax_exp", tag=STASH
            )
            total = te.compute(
                shape, lambda *i: te.sum(exponentials[at(i, second)], axis=second), name="softmax_sum", tag=tags.REDUCE
            )

        def body(*i):
            if logarithm:
                shifted = x[i].astype(acc) - largest[at(i, 0)]
                return (shifted - te.log(total[at(i, 0)])).astype(x.dtype)
            return (exponentials[i] / total[at(i, 0)]).astype(x.dtype)

        tag = "log_softmax" if logarithm else "softmax"
        return [te.compute(x.shape, body, name=tag, tag=tag)]

    return compute


set_compute("BatchNormalization", batch_norm)
set_compute("LayerNormalization", layer_norm)
set_compute("InstanceNormalization", instance_norm)
set_compute("LRN", lrn)
set_compute("GroupNormalization", group_norm)
set_compute("MeanVarianceNormalization", mean_variance_norm)
set_compute("LpNormalization", lp_norm)
set_compute("Softmax", _softmax(logarithm=False))
set_compute("LogSoftmax", _softmax(logarithm=True))
