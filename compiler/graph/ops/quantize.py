"""Quantization: QuantizeLinear and DequantizeLinear, the two steps of the QDQ form that onnxruntime's quantizer writes
(one pair per quantized tensor). DequantizeLinear: y = (x - zero_point) * scale, computed in float32 and stored in the
scale's dtype (or output_dtype); QuantizeLinear: y = saturate(round_half_to_even(x / scale) + zero_point), in the
zero point's dtype (or output_dtype, else uint8). The scale (and zero point) is per tensor, per axis or per block of
`block_size` along the axis (opset 21). Their shape rules, patterns and numpy references (ONNX's semantics);
compiler/compute/quantize.py has their computes. The other quantized forms (QOperator, integer and contrib ops) are
rewritten into these two and float ops at import (compiler/frontend/quantized.py)."""

from __future__ import annotations

import numpy as np

from compiler.errors import ShapeError, UnsupportedOpError
from compiler.graph.ir import TensorType
from compiler.graph.ops.checks import op_inputs
from compiler.graph.ops.common import normalize_axis
from compiler.graph.registry import Pattern, register_op

# The integer types a quantized tensor may have here (ONNX also allows 4-bit and 8-bit float types, which the graph
# does not hold yet), and the float types of a scale.
QUANTIZED_DTYPES = ("int8", "uint8", "int16", "int32")
SCALE_DTYPES = ("float32", "float16")


def quantization_axis(x: TensorType, scale: TensorType, attrs: dict, op: str) -> tuple[str, int, int]:
    """(granularity, axis, block_size) of a (de)quantization: "tensor" (a one-element scale), "axis" (a 1-D scale as
    long as x's axis) or "block" (block_size > 0: a scale of x's rank, the axis ceil-divided by block_size); a
    ShapeError naming what does not fit."""
    block_size = int(attrs.get("block_size", 0))
    if block_size < 0:
        raise ShapeError(f"{op}: block_size must be 0 or positive, not {block_size}")
    if block_size == 0 and scale.size == 1 and len(scale.shape) <= 1:
        return "tensor", 0, 0
    axis = normalize_axis(int(attrs.get("axis", 1)), len(x.shape), f"{op} axis")
    if block_size == 0:
        if scale.shape != (x.shape[axis],):
            raise ShapeError(
                f"{op}: a per-axis scale must have shape ({x.shape[axis]},), the length of input axis {axis}; it has "
                f"{list(scale.shape)}"
            )
        return "axis", axis, 0
    blocks = tuple(-(-size // block_size) if k == axis else size for k, size in enumerate(x.shape))
    if scale.shape != blocks:
        raise ShapeError(
            f"{op}: a blocked scale (block_size {block_size} along axis {axis}) must have shape {list(blocks)}; it "
            f"has {list(scale.shape)}"
        )
    return "block", axis, block_size


def _same_layout(zero_point: TensorType, scale: TensorType) -> bool:
    """The zero point has the scale's shape; per tensor, any one-element shape (onnxruntime's quantizer writes a
    scalar zero point beside a [1] scale for biases)."""
    if zero_point.shape == scale.shape:
        return True
    return zero_point.size == scale.size == 1 and len(zero_point.shape) <= 1 and len(scale.shape) <= 1


def _operands(op: str, types, x_dtypes: tuple[str, ...]):
    """(x, scale, zero point) of a (de)quantization, x of one of `x_dtypes` and the scale float."""
    x, scale, zero_point = op_inputs(op, types, 2, 3)
    if x.dtype not in x_dtypes:
        raise UnsupportedOpError(
            f"{op} of {x.dtype} is not supported; Tessel's {op} takes {', '.join(x_dtypes)}", {op: []}
        )
    if scale.dtype not in SCALE_DTYPES:
        raise ShapeError(f"{op}: the scale must be float32 or float16, not {scale.dtype}")
    return x, scale, zero_point


def _infer_dequantize(types, attrs):
    x, scale, zero_point = _operands("DequantizeLinear", types, QUANTIZED_DTYPES)
    if zero_point is not None and (zero_point.dtype != x.dtype or not _same_layout(zero_point, scale)):
        raise ShapeError(
            f"DequantizeLinear: the zero point must have x's dtype ({x.dtype}) and the scale's shape "
            f"({list(scale.shape)}); it is {zero_point.dtype} {list(zero_point.shape)}"
        )
    quantization_axis(x, scale, attrs, "DequantizeLinear")
    dtype = attrs.get("output_dtype") or scale.dtype
    if dtype not in SCALE_DTYPES:
        raise UnsupportedOpError(
            f"DequantizeLinear to {dtype} is not supported; its output may be float32 or float16",
            {"DequantizeLinear": []},
        )
    return [TensorType(x.shape, dtype)]


def _spread(values: np.ndarray, shape: tuple[int, ...], granularity: str, axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point laid over x's shape."""
    if granularity == "tensor":
        return values.reshape(())
    if granularity == "axis":
        return values.reshape([size if k == axis else 1 for k, size in enumerate(shape)])
    # each position reads its block's value: indexing, not np.repeat, so nothing scales with block_size itself
    return np.take(values, np.arange(shape[axis]) // block_size, axis=axis)


def _dequantize(x, scale, zero_point=None, axis=1, block_size=0, output_dtype=None, **_):
    x_type, scale_type = TensorType(x.shape, str(x.dtype)), TensorType(scale.shape, str(scale.dtype))
    granularity, axis, block_size = quantization_axis(
        x_type, scale_type, {"axis": axis, "block_size": block_size}, "DequantizeLinear"
    )
    shifted = x.astype(np.float32)
    if zero_point is not None:
        shifted = shifted - _spread(zero_point, x.shape, granularity, axis, block_size).astype(np.float32)
    result = shifted * _spread(scale, x.shape, granularity, axis, block_size).astype(np.float32)
    return result.astype(output_dtype or scale.dtype)


register_op("DequantizeLinear", infer=_infer_dequantize, pattern=Pattern.INJECTIVE, reference=_dequantize)


# The integer types QuantizeLinear writes; the default when neither a zero point nor output_dtype says.
QUANTIZE_DTYPES = ("int8", "uint8", "int16")


def quantize_dtype(zero_point_dtype: str | None, output_dtype: str | None) -> str:
    """The dtype QuantizeLinear writes: its zero point's, else output_dtype, else uint8; a ShapeError if they differ."""
    if zero_point_dtype and output_dtype and zero_point_dtype != output_dtype:
        raise ShapeError(
            f"QuantizeLinear: output_dtype is {output_dtype} but the zero point is {zero_point_dtype}; they must agree"
        )
    return zero_point_dtype or output_dtype or "uint8"


def _infer_quantize(types, attrs):
    x, scale, zero_point = _operands("QuantizeLinear", types, SCALE_DTYPES)
    dtype = quantize_dtype(zero_point.dtype if zero_point is not None else None, attrs.get("output_dtype"))
    if dtype not in QUANTIZE_DTYPES:
        raise UnsupportedOpError(
            f"QuantizeLinear to {dtype} is not supported; Tessel quantizes to {', '.join(QUANTIZE_DTYPES)}",
            {"QuantizeLinear": []},
        )
    if zero_point is not None and not _same_layout(zero_point, scale):
        raise ShapeError(
            f"QuantizeLinear: the zero point must have the scale's shape ({list(scale.shape)}); it has "
            f"{list(zero_point.shape)}"
        )
    quantization_axis(x, scale, attrs, "QuantizeLinear")
    return [TensorType(x.shape, dtype)]


def _quantize(x, scale, zero_point=None, axis=1, block_size=0, output_dtype=None, **_):
    x_type, scale_type = TensorType(x.shape, str(x.dtype)), TensorType(scale.shape, str(scale.dtype))
    granularity, axis, block_size = quantization_axis(
        x_type, scale_type, {"axis": axis, "block_size": block_size}, "QuantizeLinear"
    )
    dtype = np.dtype(quantize_dtype(str(zero_point.dtype) if zero_point is not None else None, output_dtype))
    with np.errstate(divide="ignore", invalid="ignore"):
        result = np.rint(
            x.astype(np.float32) / _spread(scale, x.shape, granularity, axis, block_size).astype(np.float32)
        )
    if zero_point is not None:
        result = result + _spread(zero_point, x.shape, granularity, axis, block_size).astype(np.float32)
    limits = np.iinfo(dtype)
    return np.clip(np.nan_to_num(result, nan=0.0), limits.min, limits.max).astype(dtype)


register_op("QuantizeLinear", infer=_infer_quantize, pattern=Pattern.INJECTIVE, reference=_quantize)
