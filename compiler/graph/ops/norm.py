"""Normalisations and softmax: BatchNormalization, InstanceNormalization, LayerNormalization, LRN,
GroupNormalization, MeanVarianceNormalization, LpNormalization, Softmax and LogSoftmax."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from compiler.errors import ShapeError, UnsupportedOpError
from compiler.graph.ir import TensorType
from compiler.graph.ops.checks import compute_dtype, float_input, op_inputs, output_count, single_output
from compiler.graph.ops.common import broadcast_shapes, normalize_axes, normalize_axis
from compiler.graph.registry import Pattern, register_op


def _channel_vector(op: str, value: TensorType | None, channels: int, what: str) -> None:
    if value is not None and value.shape != (channels,):
        raise ShapeError(f"{op} {what} has shape {list(value.shape)}; it needs ({channels},), one per channel")


def _infer_batch_norm(types, attrs):
    op = "BatchNormalization"
    if int(attrs.get("training_mode", 0)):
        raise UnsupportedOpError(
            f"{op} with training_mode=1 is not supported; export the model in inference mode (model.eval())",
            {op: []},
        )
    single_output(op, attrs)
    x, scale, bias, mean, variance = op_inputs(op, types, 5, 5)
    float_input(op, x)
    if len(x.shape) < 2:
        raise ShapeError(f"{op} input needs shape (N, C, ...), got {list(x.shape)}")
    for value, what in ((scale, "scale"), (bias, "bias"), (mean, "mean"), (variance, "var")):
        _channel_vector(op, value, x.shape[1], what)
    return [TensorType(x.shape, x.dtype)]


def _batch_norm(x, scale, bias, mean, variance, *, epsilon=1e-5, **_):
    dtype = compute_dtype(x.dtype)
    shape = (x.shape[1],) + (1,) * (x.ndim - 2)
    mean, variance, scale, bias = (v.astype(dtype, copy=False).reshape(shape) for v in (mean, variance, scale, bias))
    result = (x.astype(dtype, copy=False) - mean) / np.sqrt(variance + np.asarray(epsilon, dtype)) * scale + bias
    return result.astype(x.dtype, copy=False)


register_op("BatchNormalization", infer=_infer_batch_norm, pattern=Pattern.BROADCAST, reference=_batch_norm)


def _infer_instance_norm(types, attrs):
    op = "InstanceNormalization"
    x, scale, bias = op_inputs(op, types, 3, 3)
    float_input(op, x)
    if len(x.shape) < 3:
        raise ShapeError(f"{op} input needs shape (N, C, spatial...), got {list(x.shape)}")
    _channel_vector(op, scale, x.shape[1], "scale")
    _channel_vector(op, bias, x.shape[1], "bias")
    return [TensorType(x.shape, x.dtype)]


def _instance_norm(x, scale, bias, *, epsilon=1e-5, **_):
    dtype = compute_dtype(x.dtype)
    data = x.astype(dtype, copy=False)
    axes = tuple(range(2, x.ndim))
    mean = data.mean(axis=axes, keepdims=True)
    variance = np.square(data - mean).mean(axis=axes, keepdims=True)
    shape = (x.shape[1],) + (1,) * (x.ndim - 2)
    normalised = (data - mean) / np.sqrt(variance + np.asarray(epsilon, dtype))
    result = normalised * scale.astype(dtype).reshape(shape) + bias.astype(dtype).reshape(shape)
    return result.astype(x.dtype, copy=False)


register_op("InstanceNormalization", infer=_infer_instance_norm, pattern=Pattern.OPAQUE, reference=_instance_norm)


def stash_dtype(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


def _infer_layer_norm(types, attrs):
    op = "LayerNormalization"
    x, scale, bias = op_inputs(op, types, 2, 3)
    float_input(op, x)
    axis = normalize_axis(attrs.get("axis", -1), len(x.shape), f"{op} axis")
    normalised = x.shape[axis:]
    for value, what in ((scale, "scale"), (bias, "bias")):
        if value is not None and broadcast_shapes(value.shape, normalised) != tuple(normalised):
            raise ShapeError(f"{op} {what} of shape {list(value.shape)} does not broadcast to {list(normalised)}")
    count = output_count(attrs)
    if count > 3:
        raise ShapeError(f"{op} has at most 3 outputs (Y, Mean, InvStdDev), got {count}")
    statistics = TensorType((*x.shape[:axis], *(1,) * (len(x.shape) - axis)), stash_dtype(x.dtype))
    return [TensorType(x.shape, x.dtype), statistics, statistics][:count]


def _layer_norm(x, scale, bias=None, *, axis=-1, epsilon=1e-5, _outputs=1, **_):
    axis = normalize_axis(axis, x.ndim, "LayerNormalization axis")
    stash = np.dtype(stash_dtype(str(x.dtype)))
    data = x.astype(stash, copy=False)
    axes = tuple(range(axis, x.ndim))
    mean = data.mean(axis=axes, keepdims=True)
    centred = data - mean
    inverse_std = 1 / np.sqrt(np.square(centred).mean(axis=axes, keepdims=True) + np.asarray(epsilon, stash))
    result = centred * inverse_std * scale.astype(stash, copy=False)
    if bias is not None:
        result = result + bias.astype(stash, copy=False)
    outputs = [result.astype(x.dtype, copy=False), mean, inverse_std]
    return outputs[: int(_outputs)] if int(_outputs) > 1 else outputs[0]


register_op("LayerNormalization", infer=_infer_layer_norm, pattern=Pattern.OPAQUE, reference=_layer_norm)


def _infer_lrn(types, attrs):
    (x,) = op_inputs("LRN", types, 1, 1)
    float_input("LRN", x)
    if len(x.shape) < 3:
        raise ShapeError(f"LRN input needs shape (N, C, spatial...), got {list(x.shape)}")
    if "size" not in attrs or int(attrs["size"]) < 1:
        raise ShapeError("LRN needs a positive size attribute (the number of channels to sum over)")
    return [TensorType(x.shape, x.dtype)]


def _lrn(x, *, size, alpha=1e-4, beta=0.75, bias=1.0, **_):
    size = int(size)
    dtype = compute_dtype(x.dtype)
    squares = np.square(x.astype(dtype, copy=False))
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = np.pad(squares, [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2))
    sums = sliding_window_view(padded, size, axis=1).sum(axis=-1)
    result = x.astype(dtype, copy=False) / (np.asarray(bias, dtype) + np.asarray(alpha / size, dtype) * sums) ** beta
    return result.astype(x.dtype, copy=False)


register_op("LRN", infer=_infer_lrn, pattern=Pattern.OPAQUE, reference=_lrn)


def _infer_group_norm(types, attrs):
    op = "GroupNormalization"
    x, scale, bias = op_inputs(op, types, 3, 3)
    float_input(op, x)
    if len(x.shape) < 2:
        raise ShapeError(f"{op} input needs shape (N, C, ...), got {list(x.shape)}")
    groups = int(attrs.get("num_groups", 0))
    if groups < 1 or x.shape[1] % groups:
        raise ShapeError(f"{op} num_groups={groups} must be positive and divide the {x.shape[1]} channels")
    for value, what in ((scale, "scale"), (bias, "bias")):
        if value.shape not in ((x.shape[1],), (groups,)):
            raise ShapeError(f"{op} {what} has shape {list(value.shape)}; it needs ({x.shape[1]},), one per channel")
    return [TensorType(x.shape, x.dtype)]


def _group_norm(x, scale, bias, *, num_groups, epsilon=1e-5, **_):
    groups, channels = int(num_groups), x.shape[1]
    stash = np.dtype(stash_dtype(str(x.dtype)))
    data = x.astype(stash, copy=False).reshape(x.shape[0], groups, -1)
    mean = data.mean(axis=-1, keepdims=True)
    variance = np.square(data - mean).mean(axis=-1, keepdims=True)
    normalised = ((data - mean) / np.sqrt(variance + np.asarray(epsilon, stash))).reshape(x.shape)
    # opset 18 gave scale and bias one value per group; opset 21 gives one per channel
    scale, bias = (np.repeat(v, channels // groups) if v.shape[0] != channels else v for v in (scale, bias))
    shape = (channels,) + (1,) * (x.ndim - 2)
    result = normalised * scale.astype(stash).reshape(shape) + bias.astype(stash).reshape(shape)
    return result.astype(x.dtype, copy=False)


register_op("GroupNormalization", infer=_infer_group_norm, pattern=Pattern.OPAQUE, reference=_group_norm)


def _infer_mean_variance_norm(types, attrs):
    op = "MeanVarianceNormalization"
    (x,) = op_inputs(op, types, 1, 1)
    float_input(op, x)
    normalize_axes(attrs.get("axes", (0, 2, 3)), len(x.shape))
    return [TensorType(x.shape, x.dtype)]


def _mean_variance_norm(x, *, axes=(0, 2, 3), **_):
    axes = normalize_axes(axes, x.ndim)
    dtype = compute_dtype(x.dtype)
    data = x.astype(dtype, copy=False)
    mean = data.mean(axis=axes, keepdims=True)
    # ONNX defines it as E[x^2] - E[x]^2; rounding can make that slightly negative for constant slices
    variance = np.maximum(np.square(data).mean(axis=axes, keepdims=True) - np.square(mean), 0)
    return ((data - mean) / (np.sqrt(variance) + np.asarray(1e-9, dtype))).astype(x.dtype, copy=False)


register_op(
    "MeanVarianceNormalization",
    infer=_infer_mean_variance_norm,
    pattern=Pattern.OPAQUE,
    reference=_mean_variance_norm,
)


def _infer_lp_norm(types, attrs):
    op = "LpNormalization"
    (x,) = op_inputs(op, types, 1, 1)
    float_input(op, x)
    normalize_axis(attrs.get("axis", -1), len(x.shape), f"{op} axis")
    if int(attrs.get("p", 2)) not in (1, 2):
        raise ShapeError(f"{op} p={attrs.get('p')} is not supported; ONNX allows p=1 or p=2")
    return [TensorType(x.shape, x.dtype)]


def _lp_norm(x, *, axis=-1, p=2, **_):
    dtype = compute_dtype(x.dtype)
    data = x.astype(dtype, copy=False)
    if int(p) == 1:
        norm = np.abs(data).sum(axis=axis, keepdims=True)
    else:
        norm = np.sqrt(np.square(data).sum(axis=axis, keepdims=True))
    # a zero vector stays zero rather than becoming 0/0
    result = np.where(norm == 0, 0, data / np.where(norm == 0, 1, norm))
    return result.astype(x.dtype, copy=False)


register_op("LpNormalization", infer=_infer_lp_norm, pattern=Pattern.OPAQUE, reference=_lp_norm)


def _infer_softmax(op: str):
    def infer(types, attrs):
        (x,) = op_inputs(op, types, 1, 1)
        float_input(op, x)
        normalize_axis(attrs.get("axis", -1), len(x.shape), f"{op} axis")
        return [TensorType(x.shape, x.dtype)]

    return infer


def _shifted(x, axis: int) -> np.ndarray:
    """x minus its maximum along `axis`, in the compute dtype. An infinite maximum gives inf - inf = NaN, which is
    the answer ONNX's own reference gives for such a row, so numpy's warning about it is silenced."""
    dtype = compute_dtype(x.dtype)
    with np.errstate(invalid="ignore"):
        return x.astype(dtype, copy=False) - x.max(axis=axis, keepdims=True).astype(dtype, copy=False)


def _softmax(x, *, axis=-1, **_):
    exponentials = np.exp(_shifted(x, axis))
    return (exponentials / exponentials.sum(axis=axis, keepdims=True)).astype(x.dtype, copy=False)


def _log_softmax(x, *, axis=-1, **_):
    shifted = _shifted(x, axis)
    return (shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(x.dtype, copy=False)


register_op("Softmax", infer=_infer_softmax("Softmax"), pattern=Pattern.OPAQUE, reference=_softmax)


register_op("LogSoftmax", infer=_infer_softmax("LogSoftmax"), pattern=Pattern.OPAQUE, reference=_log_softmax)
