"""Pools: MaxPool, AveragePool, LpPool, their global forms and blocked (NCHW[x]c) forms, and MaxUnpool."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from compiler.errors import ShapeError
from compiler.graph.ir import TensorType
from compiler.graph.ops.checks import FLOAT_DTYPES, compute_dtype, float_input, op_inputs, output_count, single_output
from compiler.graph.ops.conv import block_channels, unblock_channels
from compiler.graph.ops.window import Window, explicit_pads, spatial_attr, window_of, window_view
from compiler.graph.registry import Pattern, register_op


def pool_geometry(op: str, x: TensorType, attrs: dict[str, Any]) -> Window:
    if len(x.shape) < 3:
        raise ShapeError(f"{op} input needs shape (N, C, spatial...), got {list(x.shape)}")
    rank = len(x.shape) - 2
    if attrs.get("kernel_shape") is None:
        raise ShapeError(f"{op} needs the kernel_shape attribute")
    kernel = spatial_attr(op, attrs, "kernel_shape", rank, 1)
    return window_of(op, tuple(x.shape[2:]), kernel, attrs)


def _infer_max_pool(types, attrs):
    (x,) = op_inputs("MaxPool", types, 1, 1)
    if x.dtype not in (*FLOAT_DTYPES, "int8", "uint8"):
        raise ShapeError(f"MaxPool input has dtype {x.dtype}; it needs a float, int8 or uint8 tensor")
    window = pool_geometry("MaxPool", x, attrs)
    count = output_count(attrs)
    if count > 2:
        raise ShapeError(f"MaxPool has at most 2 outputs (Y, Indices), got {count}")
    shape = (*x.shape[:2], *window.output)
    return [TensorType(shape, x.dtype), TensorType(shape, "int64")][:count]


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _max_pool(x, *, storage_order=0, _outputs=1, **attrs):
    window = pool_geometry("MaxPool", TensorType(x.shape, str(x.dtype)), attrs)
    rank = len(window.kernel)
    view = window_view(x, window, _lowest(x.dtype))
    kernel_axes = tuple(range(-rank, 0))
    if int(_outputs) < 2:
        return np.ascontiguousarray(view.max(axis=kernel_axes))
    flat = view.reshape(*view.shape[:-rank], -1)
    best = flat.argmax(axis=-1)
    values = np.take_along_axis(flat, best[..., None], axis=-1)[..., 0]
    taps = np.unravel_index(best, window.kernel)
    spatial = x.shape[2:]
    # Indices count over the unpadded input, row-major (storage_order 0) or column-major over spatial axes
    strides = [math.prod(spatial[axis + 1 :]) for axis in range(rank)]
    if int(storage_order):
        strides = [math.prod(spatial[:axis]) for axis in range(rank)]
    index = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(*x.shape[:2], *(1,) * rank) * math.prod(spatial)
    for axis in range(rank):
        positions = np.arange(window.output[axis], dtype=np.int64) * window.strides[axis] - window.pads_begin[axis]
        positions = positions.reshape(positions.shape + (1,) * (rank - 1 - axis))
        index = index + (positions + taps[axis] * window.dilations[axis]) * strides[axis]
    return [values, index.astype(np.int64)]


register_op("MaxPool", infer=_infer_max_pool, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_max_pool)


def _plain_of_blocked(op: str, x: TensorType) -> TensorType:
    if len(x.shape) != 5:
        raise ShapeError(f"{op} needs an NCHW[x]c input (N, C/x, H, W, x), got {list(x.shape)}")
    return TensorType((x.shape[0], x.shape[1] * x.shape[-1], *x.shape[2:4]), x.dtype)


def _register_blocked_pool(op: str, infer_plain, reference_plain) -> None:
    """`op`NCHWc: the pool `op` (its values only) over the spatial axes of an NCHW[x]c tensor, made by the
    alter_layout pass between blocked convolutions."""
    name = f"{op}NCHWc"

    def infer(types, attrs):
        (x,) = op_inputs(name, types, 1, 1)
        single_output(name, attrs)
        (plain,) = infer_plain([_plain_of_blocked(name, x)], attrs)
        block = x.shape[-1]
        return [TensorType((plain.shape[0], plain.shape[1] // block, *plain.shape[2:], block), plain.dtype)]

    def reference(x, **attrs):
        return block_channels(reference_plain(unblock_channels(x), **attrs), x.shape[-1])

    register_op(name, infer=infer, pattern=Pattern.OUT_EWISE_FUSABLE, reference=reference)


_register_blocked_pool("MaxPool", _infer_max_pool, _max_pool)


def _infer_average_pool(types, attrs):
    (x,) = op_inputs("AveragePool", types, 1, 1)
    float_input("AveragePool", x)
    single_output("AveragePool", attrs)
    window = pool_geometry("AveragePool", x, attrs)
    return [TensorType((*x.shape[:2], *window.output), x.dtype)]


def _average_pool(x, *, count_include_pad=0, **attrs):
    window = pool_geometry("AveragePool", TensorType(x.shape, str(x.dtype)), attrs)
    rank = len(window.kernel)
    dtype = compute_dtype(x.dtype)
    kernel_axes = tuple(range(-rank, 0))
    sums = window_view(x.astype(dtype, copy=False), window, 0).sum(axis=kernel_axes)
    # which padded positions a window counts: the input, plus the declared pads when count_include_pad is set,
    # never the extra tail that ceil_mode reads
    counted = np.ones(x.shape[2:], dtype)
    if int(count_include_pad):
        counted = np.pad(counted, list(zip(window.pads_begin, window.declared_end)), constant_values=1)
        inner = Window(
            window.kernel,
            window.strides,
            window.dilations,
            (0,) * rank,
            tuple(e - d for e, d in zip(window.read_end, window.declared_end)),
            (0,) * rank,
            window.output,
        )
        counts = window_view(counted, inner, 0).sum(axis=kernel_axes)
    else:
        counts = window_view(counted, window, 0).sum(axis=kernel_axes)
    return (sums / counts).astype(x.dtype, copy=False)


register_op("AveragePool", infer=_infer_average_pool, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_average_pool)


_register_blocked_pool("AveragePool", _infer_average_pool, _average_pool)


def _infer_global_pool(op: str):
    def infer(types, attrs):
        (x,) = op_inputs(op, types, 1, 1)
        float_input(op, x)
        if len(x.shape) < 3:
            raise ShapeError(f"{op} input needs shape (N, C, spatial...), got {list(x.shape)}")
        return [TensorType((*x.shape[:2], *(1,) * (len(x.shape) - 2)), x.dtype)]

    return infer


def _global_average_pool(x, **_):
    axes = tuple(range(2, x.ndim))
    return x.mean(axis=axes, keepdims=True, dtype=compute_dtype(x.dtype)).astype(x.dtype, copy=False)


def _global_max_pool(x, **_):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


register_op(
    "GlobalAveragePool",
    infer=_infer_global_pool("GlobalAveragePool"),
    pattern=Pattern.REDUCE,
    reference=_global_average_pool,
)


register_op(
    "GlobalMaxPool", infer=_infer_global_pool("GlobalMaxPool"), pattern=Pattern.REDUCE, reference=_global_max_pool
)


def _infer_lp_pool(types, attrs):
    (x,) = op_inputs("LpPool", types, 1, 1)
    float_input("LpPool", x)
    window = pool_geometry("LpPool", x, attrs)
    return [TensorType((*x.shape[:2], *window.output), x.dtype)]


def _lp_pool(x, *, p=2, **attrs):
    window = pool_geometry("LpPool", TensorType(x.shape, str(x.dtype)), attrs)
    dtype = compute_dtype(x.dtype)
    powers = np.abs(x.astype(dtype, copy=False)) ** np.asarray(p, dtype)
    sums = window_view(powers, window, 0).sum(axis=tuple(range(-len(window.kernel), 0)))
    return (sums ** np.asarray(1 / p, dtype)).astype(x.dtype, copy=False)


register_op("LpPool", infer=_infer_lp_pool, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_lp_pool)


def _global_lp_pool(x, *, p=2, **_):
    dtype = compute_dtype(x.dtype)
    powers = np.abs(x.astype(dtype, copy=False)) ** np.asarray(p, dtype)
    sums = powers.sum(axis=tuple(range(2, x.ndim)), keepdims=True)
    return (sums ** np.asarray(1 / p, dtype)).astype(x.dtype, copy=False)


register_op("GlobalLpPool", infer=_infer_global_pool("GlobalLpPool"), pattern=Pattern.REDUCE, reference=_global_lp_pool)


def _unpooled_shape(x: TensorType, attrs: dict[str, Any]) -> tuple[int, ...]:
    """The shape MaxUnpool scatters into: the inverse of MaxPool's output-size rule."""
    op = "MaxUnpool"
    rank = len(x.shape) - 2
    if rank < 1 or attrs.get("kernel_shape") is None:
        raise ShapeError(f"{op} needs input (N, C, spatial...) and kernel_shape, got {list(x.shape)}")
    kernel = spatial_attr(op, attrs, "kernel_shape", rank, 1)
    strides = spatial_attr(op, attrs, "strides", rank, 1)
    begins, ends = explicit_pads(op, attrs, rank)
    spatial = tuple((n - 1) * s + k - b - e for n, s, k, b, e in zip(x.shape[2:], strides, kernel, begins, ends))
    return (*x.shape[:2], *spatial)


def _infer_max_unpool(types, attrs):
    x, indices = op_inputs("MaxUnpool", types, 2, 2)
    if indices.shape != x.shape or indices.dtype != "int64":
        raise ShapeError(f"MaxUnpool indices {indices} must be int64 with the input's shape {list(x.shape)}")
    requested = attrs.get("output_shape")
    shape = tuple(int(v) for v in requested) if requested is not None else _unpooled_shape(x, attrs)
    if len(shape) != len(x.shape):
        raise ShapeError(f"MaxUnpool output_shape {list(shape)} needs {len(x.shape)} values")
    return [TensorType(shape, x.dtype)]


def _max_unpool(x, indices, *, output_shape=None, **attrs):
    inferred = _unpooled_shape(TensorType(x.shape, str(x.dtype)), attrs)
    scattered = np.zeros(math.prod(inferred), x.dtype)
    scattered[indices.reshape(-1)] = x.reshape(-1)
    if output_shape is None:
        return scattered.reshape(inferred)
    # like ONNX's reference, indices address the inferred shape, which then sits at the start of output_shape
    result = np.zeros(tuple(int(v) for v in output_shape), x.dtype)
    overlap = tuple(slice(0, min(a, b)) for a, b in zip(inferred, result.shape))
    result[overlap] = scattered.reshape(inferred)[overlap]
    return result


register_op(
    "MaxUnpool",
    infer=_infer_max_unpool,
    pattern=Pattern.OPAQUE,
    reference=_max_unpool,
    const_inputs=((2, "output_shape"),),
)
