"""Tensor-expression computes of the pools: MaxPool (with Indices), AveragePool, LpPool, their global and blocked
forms (graph/ops/pool.py)."""

from __future__ import annotations

import math
from typing import Any

import compiler.te as te
from compiler.compute import tags
from compiler.compute.conv import pad_blocked
from compiler.compute.support import Inputs, accumulator, lowest, pad, plain_of_blocked, type_of
from compiler.graph.ir import TensorType
from compiler.graph.ops.pool import pool_geometry
from compiler.graph.registry import set_compute


def max_pool_nchwc(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    """MaxPool over the spatial axes of an NCHW[x]c tensor: a vector over the channel block loads contiguously."""
    (x,) = inputs[:1]
    window = pool_geometry("MaxPoolNCHWc", plain_of_blocked(x), attrs)
    padded = pad_blocked(x, window.pads_begin, window.read_end, lowest(x.dtype))
    taps = [te.reduce_axis((0, k), f"r{axis}") for axis, k in enumerate(window.kernel)]

    def body(n, outer, row, column, inner):
        source = _window_source(window, (row, column), taps)
        return te.max(padded[(n, outer, *source, inner)], axis=taps)

    return [te.compute(output_types[0].shape, body, name="max_pool", tag=tags.POOL_MAX)]


def _window_source(window, spatial, taps):
    return [o * s + r * d for o, s, r, d in zip(spatial, window.strides, taps, window.dilations)]


def max_pool(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    (x,) = inputs[:1]
    window = pool_geometry("MaxPool", type_of(x), attrs)
    taps = [te.reduce_axis((0, k), f"r{axis}") for axis, k in enumerate(window.kernel)]
    padded = pad(x, window.pads_begin, window.read_end, lowest(x.dtype), "pad")

    def body(n, c, *spatial):
        return te.max(padded[(n, c, *_window_source(window, spatial, taps))], axis=taps)

    values = te.compute(output_types[0].shape, body, name="max_pool", tag=tags.POOL_MAX)
    if len(output_types) == 1:
        return [values]
    return [values, _argmax_indices(x, padded, values, window, int(attrs.get("storage_order", 0)))]


def _argmax_indices(x: te.Tensor, padded: te.Tensor, values: te.Tensor, window, storage_order: int) -> te.Tensor:
    """MaxPool's Indices: the first tap (row-major over the window, as numpy's argmax) holding the maximum, as a
    flat index into the unpadded input (its spatial axes row-major, or column-major with storage_order=1)."""
    kernel, rank = window.kernel, len(window.kernel)
    spatial_sizes = x.shape[2:]
    taps = [te.reduce_axis((0, k), f"t{axis}") for axis, k in enumerate(kernel)]
    count = math.prod(kernel)

    def first_tap(n, c, *spatial):
        ordinal = taps[0]
        for axis in range(1, rank):
            ordinal = ordinal * kernel[axis] + taps[axis]
        value = padded[(n, c, *_window_source(window, spatial, taps))]
        hit = te.Compare("eq", value, values[(n, c, *spatial)])
        return te.min(te.select(hit, ordinal, te.const(count)), axis=taps)

    tap = te.compute(values.shape, first_tap, name="max_pool_tap", tag=tags.REDUCE)
    if storage_order:
        strides = [math.prod(spatial_sizes[:axis]) for axis in range(rank)]
    else:
        strides = [math.prod(spatial_sizes[axis + 1 :]) for axis in range(rank)]

    def index(n, c, *spatial):
        ordinal = tap[(n, c, *spatial)]
        flat = (n * x.shape[1] + c).astype("int64") * math.prod(spatial_sizes)
        for axis in reversed(range(rank)):
            offset = ordinal % kernel[axis] if axis else ordinal
            ordinal = ordinal // kernel[axis]
            position = spatial[axis] * window.strides[axis] - window.pads_begin[axis] + offset * window.dilations[axis]
            flat = flat + position.astype("int64") * strides[axis]
        return flat

    return te.compute(values.shape, index, name="max_pool_indices", tag=tags.ELEMWISE)


def _count(base, kernel: int, dilation: int, low: int, high: int):
    """How many taps r in [0, kernel) put base + r * dilation inside [low, high): a closed form, so the
    divisor of an average pool costs a few integer ops per output, not a loop."""
    smallest = te.maximum((low - base + dilation - 1) // dilation, 0)
    largest = te.minimum((high - 1 - base) // dilation, kernel - 1)
    return te.maximum(largest - smallest + 1, 0)


def _average_pool(blocked: bool):
    """AveragePool over NCHW, or (blocked) over the spatial axes of NCHW[x]c, where a vector over the channel
    block loads contiguously; the divisor is each window's count of counted positions."""

    def compute(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
        (x,) = inputs[:1]
        plain = plain_of_blocked(x) if blocked else type_of(x)
        window = pool_geometry("AveragePool", plain, attrs)
        include_pad = bool(int(attrs.get("count_include_pad", 0)))
        acc = accumulator(x.dtype)
        rank = len(window.kernel)
        taps = [te.reduce_axis((0, k), f"r{axis}") for axis, k in enumerate(window.kernel)]
        shape = output_types[0].shape
        if blocked:
            padded = pad_blocked(x, window.pads_begin, window.read_end)

            def read(n, c, rest):
                return padded[(n, c, *_window_source(window, rest[:rank], taps), *rest[rank:])]

        else:
            padded = pad(x, window.pads_begin, window.read_end, 0.0, "pad")

            def read(n, c, rest):
                return padded[(n, c, *_window_source(window, rest, taps))]

        def body(n, c, *rest):
            return te.sum(read(n, c, rest).astype(acc), axis=taps)

        sums = te.compute(shape, body, name="pool_sum", tag=tags.POOL_AVG)
        sizes = plain.shape[2:]

        def divide(*index):
            count = None
            for axis, o in enumerate(index[2 : 2 + rank]):
                begin = window.pads_begin[axis]
                low = -begin if include_pad else 0
                high = sizes[axis] + window.declared_end[axis] if include_pad else sizes[axis]
                base = o * window.strides[axis] - begin
                term = _count(base, window.kernel[axis], window.dilations[axis], low, high)
                count = term if count is None else count * term
            return (sums[index] / count.astype(acc)).astype(x.dtype)

        return [te.compute(shape, divide, name="average_pool", tag=tags.ELEMWISE)]

    return compute


def pool_power(value, p: float):
    """|value| ** p, with the common orders as plain arithmetic rather than exp/log."""
    magnitude = te.abs(value)
    if p == 1:
        return magnitude
    if p == 2:
        return value * value
    return te.pow(magnitude, float(p))


def root(value, p: float):
    if p == 1:
        return value
    if p == 2:
        return te.sqrt(value)
    return te.pow(value, 1.0 / p)


def lp_pool(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    (x,) = inputs[:1]
    p = float(attrs.get("p", 2))
    window = pool_geometry("LpPool", type_of(x), attrs)
    acc = accumulator(x.dtype)
    padded = pad(x, window.pads_begin, window.read_end, 0.0, "pad")
    taps = [te.reduce_axis((0, k), f"r{axis}") for axis, k in enumerate(window.kernel)]
    shape = output_types[0].shape

    def body(n, c, *spatial):
        value = padded[(n, c, *_window_source(window, spatial, taps))].astype(acc)
        return te.sum(pool_power(value, p), axis=taps)

    sums = te.compute(shape, body, name="lp_pool_sum", tag=tags.POOL_AVG)
    return [te.compute(shape, lambda *i: root(sums[i], p).astype(x.dtype), name="lp_pool", tag=tags.ELEMWISE)]


def global_lp_pool(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    (x,) = inputs[:1]
    p = float(attrs.get("p", 2))
    acc = accumulator(x.dtype)
    taps = [te.reduce_axis((0, size), f"r{axis}") for axis, size in enumerate(x.shape[2:])]
    shape = output_types[0].shape
    sums = te.compute(
        shape,
        lambda n, c, *_: te.sum(pool_power(x[(n, c, *taps)].astype(acc), p), axis=taps),
        name="global_lp_sum",
        tag=tags.GLOBAL_POOL,
    )
    return [te.compute(shape, lambda *i: root(sums[i], p).astype(x.dtype), name="global_lp_pool", tag=tags.ELEMWISE)]


def _global_pool(combiner: str):
    def compute(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
        (x,) = inputs[:1]
        acc = accumulator(x.dtype)
        spatial = x.shape[2:]
        taps = [te.reduce_axis((0, size), f"r{axis}") for axis, size in enumerate(spatial)]
        shape = output_types[0].shape
        if combiner == "max":
            return [
                te.compute(
                    shape, lambda n, c, *_: te.max(x[(n, c, *taps)], axis=taps), name="global_max", tag=tags.GLOBAL_POOL
                )
            ]
        sums = te.compute(
            shape,
            lambda n, c, *_: te.sum(x[(n, c, *taps)].astype(acc), axis=taps),
            name="global_sum",
            tag=tags.GLOBAL_POOL,
        )
        count = math.prod(spatial)
        return [
            te.compute(
                shape, lambda *i: (sums[i] / float(count)).astype(x.dtype), name="global_average", tag=tags.ELEMWISE
            )
        ]

    return compute


set_compute("MaxPoolNCHWc", max_pool_nchwc)
set_compute("MaxPool", max_pool)
set_compute("AveragePool", _average_pool(blocked=False))
set_compute("AveragePoolNCHWc", _average_pool(blocked=True))
set_compute("GlobalAveragePool", _global_pool("sum"))
set_compute("GlobalMaxPool", _global_pool("max"))
set_compute("LpPool", lp_pool)
set_compute("GlobalLpPool", global_lp_pool)
