"""Quantized seeds and integer mutations for the model fuzzer (issue 41): models in the forms onnxruntime's quantizer
writes (QuantizeLinear/DequantizeLinear around a MatMul or Conv, per-tensor, per-axis and blocked scales, int8 and
uint8 zero points) and the ways their integer tensors are malformed: a zero, negative, nan or infinite scale, a zero
point of the wrong dtype or shape, a scale whose shape does not fit the axis, a block size that does not divide, an
axis far out of range. Each case must end as fuzz_models.judge requires: one TesselError or onnxruntime's result.
Ops Tessel does not have yet end in an UnsupportedOpError, which is clean; those seeds exercise more as they land."""

from __future__ import annotations

import random

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.fuzz.fuzz_models import _edit, _flip_bits, _info, _model, _param


def _dq(name, data, scale, zero_point=None, **attrs):
    inputs = [data, scale] + ([zero_point] if zero_point else [])
    return helper.make_node("DequantizeLinear", inputs, [name], **attrs)


def _q(name, data, scale, zero_point, **attrs):
    return helper.make_node("QuantizeLinear", [data, scale, zero_point], [name], **attrs)


def quantized_models() -> dict[str, onnx.ModelProto]:
    """QDQ around a MatMul and a Conv (as quantize_static writes them), weight-only DQ with per-axis and blocked
    scales (opset 21), and integer graph inputs dequantized at run time."""
    rng = np.random.default_rng(1)
    int8 = lambda shape: rng.integers(-128, 128, shape).astype(np.int8)  # noqa: E731
    uint8 = lambda shape: rng.integers(0, 256, shape).astype(np.uint8)  # noqa: E731
    scale = lambda shape: (rng.random(shape) * 0.05 + 0.01).astype(np.float32)  # noqa: E731
    return {
        "qdq_matmul": _model(
            [
                _q("xq", "x", "x_scale", "x_zero"),
                _dq("xd", "xq", "x_scale", "x_zero"),
                _dq("wd", "w", "w_scale", "w_zero"),
                helper.make_node("MatMul", ["xd", "wd"], ["m"]),
                _q("mq", "m", "m_scale", "m_zero"),
                _dq("y", "mq", "m_scale", "m_zero"),
            ],
            [_info("x", [2, 8])],
            [_info("y", [2, 4])],
            [
                _param("x_scale", np.float32(0.02)),
                _param("x_zero", np.uint8(128)),
                _param("w", int8((8, 4))),
                _param("w_scale", np.float32(0.03)),
                _param("w_zero", np.int8(0)),
                _param("m_scale", np.float32(0.05)),
                _param("m_zero", np.uint8(120)),
            ],
            opset=13,
        ),
        "qdq_conv_per_axis": _model(
            [
                _q("xq", "x", "x_scale", "x_zero"),
                _dq("xd", "xq", "x_scale", "x_zero"),
                _dq("wd", "w", "w_scale", "w_zero", axis=0),
                helper.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
                helper.make_node("Relu", ["c"], ["r"]),
                _q("rq", "r", "r_scale", "r_zero"),
                _dq("y", "rq", "r_scale", "r_zero"),
            ],
            [_info("x", [1, 2, 5, 5])],
            [_info("y", [1, 3, 5, 5])],
            [
                _param("x_scale", np.float32(0.02)),
                _param("x_zero", np.uint8(128)),
                _param("w", int8((3, 2, 3, 3))),
                _param("w_scale", scale(3)),
                _param("w_zero", np.zeros(3, np.int8)),
                _param("b", rng.standard_normal(3).astype(np.float32)),
                _param("r_scale", np.float32(0.1)),
                _param("r_zero", np.uint8(0)),
            ],
            opset=13,
        ),
        "dq_matmul_blocked": _model(
            [_dq("wd", "w", "w_scale", "w_zero", axis=0, block_size=4), helper.make_node("MatMul", ["x", "wd"], ["y"])],
            [_info("x", [2, 8])],
            [_info("y", [2, 4])],
            [_param("w", int8((8, 4))), _param("w_scale", scale((2, 4))), _param("w_zero", int8((2, 4)))],
            opset=21,
        ),
        "dq_conv_per_tensor": _model(
            [
                _dq("wd", "w", "w_scale", "w_zero"),
                helper.make_node("Conv", ["x", "wd"], ["y"], kernel_shape=[1, 1]),
            ],
            [_info("x", [1, 4, 3, 3])],
            [_info("y", [1, 2, 3, 3])],
            [_param("w", uint8((2, 4, 1, 1))), _param("w_scale", np.float32(0.04)), _param("w_zero", np.uint8(130))],
            opset=13,
        ),
        "dq_input_per_axis": _model(
            [_dq("d", "x", "x_scale", "x_zero", axis=1), helper.make_node("Softmax", ["d"], ["y"], axis=-1)],
            [_info("x", [2, 3, 4], TensorProto.UINT8)],
            [_info("y", [2, 3, 4])],
            [_param("x_scale", scale(3)), _param("x_zero", uint8(3))],
            opset=13,
        ),
        "dq_input_blocked": _model(
            [
                _dq("d", "x", "x_scale", "x_zero", axis=1, block_size=2),
                helper.make_node("MatMul", ["d", "w"], ["y"]),
            ],
            [_info("x", [2, 6], TensorProto.INT8)],
            [_info("y", [2, 3])],
            [
                _param("x_scale", scale((2, 3))),
                _param("x_zero", int8((2, 3))),
                _param("w", rng.standard_normal((6, 3)).astype(np.float32)),
            ],
            opset=21,
        ),
    }


# -- mutations of integer tensors --------------------------------------------------------------------------------

_SCALES = (0.0, -0.5, float("nan"), float("inf"), -float("inf"), 1e-45, 3.4e38)
_INTEGER_DTYPES = (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64)
_AXES = (-(1 << 40), -5, -1, 0, 1, 2, 3, 7, 1 << 33, 1 << 62)
# Block sizes that do not divide the axis, exceed it, or are not positive. The largest stays at 2^16: the numpy
# reference spreads a blocked scale by repeating it block_size times (graph/ops/quantize.py, _spread), so a huge one
# is a huge allocation there, a known defect of that module that this fuzzer would only rediscover.
_BLOCK_SIZES = (-4, -1, 0, 1, 3, 5, 7, 9, 64, 1 << 16)


def _quantized_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    return [node for node in graph.node if node.op_type in ("QuantizeLinear", "DequantizeLinear")]


def _initializer(graph: onnx.GraphProto, name: str) -> TensorProto | None:
    return next((tensor for tensor in graph.initializer if tensor.name == name), None)


def _replace(tensor: TensorProto, array: np.ndarray) -> None:
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))


def _set_attribute(node: onnx.NodeProto, name: str, value: int) -> None:
    for attribute in node.attribute:
        if attribute.name == name:
            attribute.CopyFrom(helper.make_attribute(name, value))
            return
    node.attribute.append(helper.make_attribute(name, value))


def _mutate_quantized(data: bytes, rng: random.Random) -> bytes:
    model = onnx.ModelProto()
    model.ParseFromString(data)
    graph = model.graph
    node = rng.choice(_quantized_nodes(graph))
    scale = _initializer(graph, node.input[1])
    zero_point = _initializer(graph, node.input[2]) if len(node.input) > 2 and node.input[2] else None
    kind = rng.choice(
        (
            "scale_value",
            "scale_dtype",
            "zero_point_dtype",
            "zero_point_shape",
            "scale_shape",
            "block_size",
            "axis",
            "data_dtype",
        )
    )
    if kind == "scale_value" and scale is not None:
        array = numpy_helper.to_array(scale).copy()
        array.reshape(-1)[rng.randrange(max(array.size, 1))] = rng.choice(_SCALES)
        if rng.random() < 0.3:
            array[...] = rng.choice(_SCALES)
        _replace(scale, array)
    elif kind == "scale_dtype" and scale is not None:
        # float16 is a valid scale from opset 19; the others never are
        elem_type = rng.choice((TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT32, TensorProto.UINT8))
        _replace(scale, _as_dtype(numpy_helper.to_array(scale), elem_type))
    elif kind == "zero_point_dtype" and zero_point is not None:
        array = _as_dtype(numpy_helper.to_array(zero_point), rng.choice(_INTEGER_DTYPES + (TensorProto.FLOAT,)))
        _replace(zero_point, array)
    elif kind == "zero_point_shape" and zero_point is not None:
        array = numpy_helper.to_array(zero_point)
        _replace(zero_point, _reshaped(array, rng))
    elif kind == "scale_shape" and scale is not None:
        _replace(scale, _reshaped(numpy_helper.to_array(scale), rng))
    elif kind in ("block_size", "axis"):
        _set_attribute(node, kind, rng.choice(_BLOCK_SIZES if kind == "block_size" else _AXES))
        if rng.random() < 0.5:
            # the scale and zero point follow, so that the case reaches what the new value means
            _fit_scales(graph, node)
    elif kind == "data_dtype":
        # the quantized tensor itself in another integer type than its zero point (or as float)
        data_tensor = _initializer(graph, node.input[0])
        if data_tensor is not None:
            cast = _as_dtype(numpy_helper.to_array(data_tensor), rng.choice(_INTEGER_DTYPES + (TensorProto.FLOAT,)))
            _replace(data_tensor, cast)
        else:
            infos = [info for info in graph.input if info.name == node.input[0]]
            for info in infos:
                info.type.tensor_type.elem_type = rng.choice(_INTEGER_DTYPES)
    return model.SerializeToString()


def _fit_scales(graph: onnx.GraphProto, node: onnx.NodeProto) -> None:
    """Give the node's scale and zero point the shape its axis and block_size ask of them (their values repeated),
    where the axis is one of the data's."""
    attributes = {attribute.name: attribute.i for attribute in node.attribute}
    data = _initializer(graph, node.input[0])
    infos = [info for info in graph.input if info.name == node.input[0]]
    if data is not None:
        shape = list(data.dims)
    elif infos:
        shape = [dim.dim_value for dim in infos[0].type.tensor_type.shape.dim]
    else:
        return
    axis, block_size = attributes.get("axis", 1), attributes.get("block_size", 0)
    if not -len(shape) <= axis < len(shape):
        return
    if block_size > 0:
        shape[axis] = -(-shape[axis] // block_size)
    else:
        shape = [shape[axis]]
    for name in node.input[1:]:
        tensor = _initializer(graph, name) if name else None
        if tensor is not None:
            _replace(tensor, np.resize(numpy_helper.to_array(tensor), shape))


def _as_dtype(array: np.ndarray, elem_type: int) -> np.ndarray:
    """The values in another ONNX dtype (wrapping where they do not fit)."""
    return array.astype(helper.tensor_dtype_to_np_dtype(elem_type))


def _reshaped(array: np.ndarray, rng: random.Random) -> np.ndarray:
    """The same kind of values in a shape one step off: a scalar made 1-D, an element more or less, an axis more."""
    choice = rng.randrange(4)
    flat = array.reshape(-1)
    if choice == 0:
        return flat[:1].reshape(()) if array.ndim else flat.reshape(1)
    if choice == 1:
        return np.concatenate([flat, flat[:1]])
    if choice == 2:
        return flat[:-1] if flat.size > 1 else flat.reshape(1, 1)
    return array.reshape(*array.shape, 1)


def _mutate_attribute_types(data: bytes, rng: random.Random) -> bytes:
    """axis or block_size given as another attribute type, which the schema check must refuse."""
    model = onnx.ModelProto()
    model.ParseFromString(data)
    node = rng.choice(_quantized_nodes(model.graph))
    name = rng.choice(("axis", "block_size"))
    value = rng.choice((1.5, [1, 2], "x"))
    attribute = helper.make_attribute(name, value)
    for existing in list(node.attribute):
        if existing.name == name:
            node.attribute.remove(existing)
    node.attribute.append(attribute)
    return model.SerializeToString()


# Mostly the integer mutations; the model fuzzer's edits (dims, dtypes, names...) and bit flips now and then, as
# quantized models meet those too. Truncations, which end in the protobuf parser, are left to the model fuzzer.
MUTATIONS = (*[_mutate_quantized] * 6, _mutate_attribute_types, _edit, _edit, _flip_bits)
