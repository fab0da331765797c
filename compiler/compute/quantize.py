"""The tensor-expression compute of DequantizeLinear (compiler/graph/ops/quantize.py): one injective stage reading x
and the scale (and zero point) at x's position projected onto the scale's layout, in float32 as the reference."""

from __future__ import annotations

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


def dequantize_linear(inputs, attrs, output_types):
    x, scale, zero_point = (*inputs, None)[:3]
    granularity, axis, block_size = quantization_axis(
        TensorType(tuple(x.shape), x.dtype), TensorType(tuple(scale.shape), scale.dtype), attrs, "DequantizeLinear"
    )
    flat_scale = granularity == "tensor" and len(scale.shape) == 1

    def read(tensor: te.Tensor, index: tuple):
        at = _scale_index(index, granularity, axis, block_size)
        return tensor[(0,) if flat_scale else at].astype("float32")

    def body(*index):
        value = x[index].astype("float32")
        if zero_point is not None:
            value = value - read(zero_point, index)
        return (value * read(scale, index)).astype(output_types[0].dtype)

    return [te.compute(output_types[0].shape, body, name="dequantize_linear", tag=tags.INJECTIVE)]


set_compute("DequantizeLinear", dequantize_linear)
