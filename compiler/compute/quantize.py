"""The tensor-expression computes of DequantizeLinear and QuantizeLinear (compiler/graph/ops/quantize.py): one
injective stage each, reading x and the scale (and zero point) at x's position projected onto the scale's layout, in
float32 as the references; QuantizeLinear rounds half to even and saturates to its integer type."""

from __future__ import annotations

import numpy as np

import compiler.te as te
from compiler.compute import tags
from compiler.graph.ir import TensorType
from compiler.graph.ops.quantize import quantization_axis
from compiler.graph.registry import set_compute


def _scale_index(index: tuple, granularity: str, axis: int, block_size: int) -> tuple:
    """Where the output position `index` reads the scale and the zero point."""
    if granularity == "tensor":
        return ()
    if granularity == "axis":
        return (index[axis],)
    return tuple(position // block_size if k == axis else position for k, position in enumerate(index))


def _reader(x: te.Tensor, scale: te.Tensor, attrs: dict, op: str):
    """read(tensor, index): the scale's (or zero point's) element for x's position `index`, in float32."""
    granularity, axis, block_size = quantization_axis(
        TensorType(tuple(x.shape), x.dtype), TensorType(tuple(scale.shape), scale.dtype), attrs, op
    )

    def read(tensor: te.Tensor, index: tuple):
        if granularity == "tensor":  # a scalar, or one element of any rank
            return tensor[(0,) * len(tensor.shape)].astype("float32")
        return tensor[_scale_index(index, granularity, axis, block_size)].astype("float32")

    return read


def dequantize_linear(inputs, attrs, output_types):
    x, scale, zero_point = (*inputs, None)[:3]
    read = _reader(x, scale, attrs, "DequantizeLinear")

    def body(*index):
        value = x[index].astype("float32")
        if zero_point is not None:
            value = value - read(zero_point, index)
        return (value * read(scale, index)).astype(output_types[0].dtype)

    return [te.compute(output_types[0].shape, body, name="dequantize_linear", tag=tags.INJECTIVE)]


set_compute("DequantizeLinear", dequantize_linear)


def quantize_linear(inputs, attrs, output_types):
    x, scale, zero_point = (*inputs, None)[:3]
    read = _reader(x, scale, attrs, "QuantizeLinear")
    dtype = output_types[0].dtype
    limits = np.iinfo(dtype)
    low, high = te.const(float(limits.min), "float32"), te.const(float(limits.max), "float32")

    def body(*index):
        value = te.round(x[index].astype("float32") / read(scale, index))
        if zero_point is not None:
            value = value + read(zero_point, index)
        return te.minimum(te.maximum(value, low), high).astype(dtype)

    return [te.compute(output_types[0].shape, body, name="quantize_linear", tag=tags.INJECTIVE)]


set_compute("QuantizeLinear", quantize_linear)
