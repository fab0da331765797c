"""Quantized models' ops, rewritten at import into QuantizeLinear, DequantizeLinear and float ops.

onnxruntime's quantizer writes three forms besides QDQ, and the graph keeps one: an integer product is a float op on
zero-point-shifted integers (exact: every product and partial sum of 8-bit operands is an integer that float32 holds
exactly while it stays below 2**24 in magnitude, which a sum of K products of at most 255 * 128 does for any K up to
513, and for far longer sums of real data), then a requantization (a multiply by scale_a * scale_b / scale_y and a
QuantizeLinear with scale 1: round half to even, add the zero point, saturate), as onnxruntime's kernels compute it.

- QuantizeLinear and DequantizeLinear themselves: per tensor on an activation, the elementwise ops they are (x /
  scale rounded, shifted, clipped, cast; (x - zero) * scale), which fuse into epilogues and flow through blocked
  layouts; on a weight or per axis or block, the ops (a weight stays narrow: passes/alter_layout.py).
- QOperator form: QLinearConv, QLinearMatMul (ONNX); QLinearAdd, QLinearMul, QLinearGlobalAveragePool,
  QLinearAveragePool, QLinearConcat, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QGemm (com.microsoft).
- Integer ops of dynamic quantization: DynamicQuantizeLinear, MatMulInteger, ConvInteger.
- 4- and 8-bit weights: com.microsoft MatMulNBits, its packed blocks unpacked at import into a blocked
  DequantizeLinear of the weight, transposed into the MatMul (https://github.com/microsoft/onnxruntime/blob/main/docs/
  ContribOperators.md#com.microsoft.MatMulNBits describes the packing).

Each rewrite sees the node's inputs as graph Values (None for an omitted optional one) and its attributes, and emits
registered ops through the importer (`Builder`), which folds whatever is constant, so constant weights and scales
become params. The importer names the node in every error raised here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import AttributeProto

from compiler.errors import ModelError, ShapeError, UnsupportedOpError
from compiler.graph.ir import Value
from compiler.graph.ops.dense import pack_nibbles
from compiler.graph.registry import get_op

CONTRIB_DOMAIN = "com.microsoft"


class Builder:
    """What a rewrite needs from the importer: emit a registered op (folded when its inputs are constant), make a
    constant, and read a constant's value."""

    def __init__(self, emit: Callable, constant: Callable, params: dict, label: str):
        self._emit, self._constant, self.params, self.label = emit, constant, params, label
        self._count = 0

    def op(self, op: str, inputs: list, attrs: dict | None = None, output: str | None = None) -> Value:
        self._count += 1
        (value,) = self._emit(op, inputs, attrs or {}, f"{self.label}_{op.lower()}{self._count}", [output or ""])[:1]
        return value

    def const(self, array, dtype: str = "float32") -> Value:
        return self._constant(np.asarray(array, dtype=dtype), f"{self.label}_const")

    def value(self, value: Value | None) -> np.ndarray | None:
        return None if value is None else self.params.get(value)

    # -- the pieces the rewrites share

    def float32(self, value: Value) -> Value:
        return value if value.type.dtype == "float32" else self.op("Cast", [value], {"to": "float32"})

    def shifted(self, x: Value, zero_point: Value | None, zero_shape: tuple[int, ...] | None = None) -> Value:
        """x - zero_point in float32 (exact for integers), the zero point laid out as `zero_shape` (numpy broadcasting
        against x: () per tensor, one axis longer than 1 per axis). A DequantizeLinear with scale 1, so that a constant
        weight stays narrow (passes/alter_layout.py, pack_dense)."""
        if x.type.dtype not in ("int8", "uint8"):
            result = self.float32(x)
            if zero_point is None:
                return result
            zero = self.float32(zero_point)
            if zero_shape is not None and zero.type.shape != zero_shape:
                zero = self.op("Reshape", [zero], {"shape": zero_shape})
            return self.op("Sub", [result, zero])
        if zero_point is None or zero_point.type.size == 1:
            zero = None if zero_point is None else self.op("Reshape", [zero_point], {"shape": (1,)})
            return self.dequantize(x, self.const([1.0]), zero)
        (position,) = [k for k, size in enumerate(zero_shape) if size != 1]
        count = zero_shape[position]
        zero = self.op("Reshape", [zero_point], {"shape": (count,)})
        axis = len(x.type.shape) - len(zero_shape) + position
        return self.op("DequantizeLinear", [x, self.const(np.ones(count)), zero], {"axis": axis})

    def requantize(self, accumulator: Value, multiplier: Value, zero_point: Value | None, output: str) -> Value:
        """QuantizeLinear(accumulator * multiplier, 1, zero_point): round half to even, shift, saturate."""
        scaled = self.op("Mul", [accumulator, multiplier])
        zero = None if zero_point is None else self.op("Reshape", [zero_point], {"shape": (1,)})
        return self.quantize(scaled, self.const([1.0]), zero, output)

    def dequantize(self, x: Value, scale: Value, zero_point: Value | None, attrs=None, output=None) -> Value:
        """DequantizeLinear; of an activation with one scale, as the elementwise ops it is (x - zero) * scale, which
        every layout and epilogue takes, where the op's per-axis form is an injective stage of its own. A weight
        (a param) keeps the op, so that a kernel may read it narrow."""
        inputs = [x, scale] if zero_point is None else [x, scale, zero_point]
        attrs = attrs or {}
        (wanted,) = get_op("DequantizeLinear").infer([v.type for v in inputs], attrs)  # its checks, in one place
        if x in self.params or not _one_scale(scale, zero_point):
            return self.op("DequantizeLinear", inputs, attrs, output)
        value = self.shifted_scalar(x, zero_point)
        scale = self.scalar(scale, x)
        if wanted.dtype == "float32":
            return self.op("Mul", [value, scale], {}, output)
        return self.op("Cast", [self.op("Mul", [value, scale])], {"to": wanted.dtype}, output)

    def quantize(self, x: Value, scale: Value, zero_point: Value | None, output: str | None, attrs=None) -> Value:
        """QuantizeLinear; with one scale, the elementwise ops it is: saturate(round(x / scale) + zero), in float32
        (Round is half to even), then cast to the integer type, which fuse into the producer's epilogue."""
        inputs = [x, scale] if zero_point is None else [x, scale, zero_point]
        attrs = attrs or {}
        (wanted,) = get_op("QuantizeLinear").infer([v.type for v in inputs], attrs)
        if x in self.params or not _one_scale(scale, zero_point):
            return self.op("QuantizeLinear", inputs, attrs, output)
        levels = self.op("Round", [self.op("Div", [self.float32(x), self.scalar(scale, x)])])
        if zero_point is not None:
            levels = self.op("Add", [levels, self.scalar(zero_point, x)])
        limits = np.iinfo(wanted.dtype)
        levels = self.op("Clip", [levels], {"min": float(limits.min), "max": float(limits.max)})
        return self.op("Cast", [levels], {"to": wanted.dtype}, output)

    def shifted_scalar(self, x: Value, zero_point: Value | None) -> Value:
        value = self.float32(x)
        if zero_point is None:
            return value
        return self.op("Sub", [value, self.scalar(zero_point, x)])

    def scalar(self, value: Value, like: Value) -> Value:
        """A one-element value in float32, shaped to broadcast against `like` without changing its shape: (1,), or ()
        for a scalar `like`. Never (), for a tensor, because a value computed at run time (a scale that is a graph
        input) then makes a kernel of one element, which GPU targets need an axis to run."""
        return self.op("Reshape", [self.float32(value)], {"shape": (1,) if like.type.shape else ()})


def _one_scale(scale: Value, zero_point: Value | None) -> bool:
    return scale.type.size == 1 and (zero_point is None or zero_point.type.size == 1)


def _quantize_node(b: Builder, inputs, attrs, outputs):
    x, scale, zero = (*inputs, None)[:3]
    _checked_scale(b, scale)
    b.quantize(x, scale, zero, outputs[0], attrs)


def _dequantize_node(b: Builder, inputs, attrs, outputs):
    x, scale, zero = (*inputs, None)[:3]
    _checked_scale(b, scale, dequantize=True)
    b.dequantize(x, scale, zero, attrs, outputs[0])


def _checked_scale(b: Builder, scale: Value, dequantize: bool = False) -> None:
    array = b.value(scale)
    if array is not None:
        check_scale(array, f"the scale {scale.name!r}", dequantize)


def _per_tensor(value: Value | None, what: str) -> None:
    if value is not None and value.type.size != 1:
        raise ShapeError(f"{what} must hold one value (per-tensor quantization); it has shape {list(value.type.shape)}")


def _row_shape(value: Value | None, rows: int, what: str) -> tuple[int, ...] | None:
    """A per-row scale or zero point of A ([M]) as (M, 1), to broadcast over A's columns; None when per tensor."""
    if value is None or value.type.size == 1:
        return None if value is None else ()
    if value.type.shape != (rows,):
        raise ShapeError(f"{what} must hold one value or one per row of A ({rows}); it has {list(value.type.shape)}")
    return (rows, 1)


def _column_shape(value: Value | None, columns: int, what: str) -> tuple[int, ...] | None:
    """A per-column scale or zero point of B ([N]), which broadcasts over B's rows as it is."""
    if value is None or value.type.size == 1:
        return None if value is None else ()
    if value.type.shape not in ((columns,), (1, columns)):
        raise ShapeError(
            f"{what} must hold one value or one per column of B ({columns}); it has {list(value.type.shape)}"
        )
    return (columns,)


def _channel_shape(value: Value | None, channels: int, rank: int, what: str) -> tuple[int, ...] | None:
    """A per-output-channel scale or zero point ([M]) laid along axis 0 of a rank-`rank` weight."""
    if value is None or value.type.size == 1:
        return None if value is None else ()
    if value.type.shape != (channels,):
        raise ShapeError(
            f"{what} must hold one value or one per output channel ({channels}); it has {list(value.type.shape)}"
        )
    return (channels, *[1] * (rank - 1))


def _multiplier(b: Builder, scales: list[tuple[Value, tuple | None]], y_scale: Value | None) -> Value:
    """scale_a * scale_b (/ scale_y), each reshaped to broadcast, in float32."""
    product = None
    for scale, shape in scales:
        scale = b.float32(scale)
        if shape is not None and scale.type.shape != shape:
            scale = b.op("Reshape", [scale], {"shape": shape})
        product = scale if product is None else b.op("Mul", [product, scale])
    if y_scale is not None:
        product = b.op("Div", [product, b.op("Reshape", [b.float32(y_scale)], {"shape": (1,)})])
    return product


# -- the rewrites -------------------------------------------------------------------------------------------------


def _matmul_integer(b: Builder, inputs, attrs, outputs):
    a, w, a_zero, w_zero = (*inputs, None, None)[:4]
    rows, columns = a.type.shape[-2] if len(a.type.shape) > 1 else 1, w.type.shape[-1]
    product = b.op(
        "MatMul",
        [
            b.shifted(a, a_zero, _row_shape(a_zero, rows, "a_zero_point")),
            b.shifted(w, w_zero, _column_shape(w_zero, columns, "b_zero_point")),
        ],
    )
    b.op("Cast", [product], {"to": "int32"}, outputs[0])


def _conv_integer(b: Builder, inputs, attrs, outputs):
    x, w, x_zero, w_zero = (*inputs, None, None)[:4]
    _per_tensor(x_zero, "x_zero_point")
    rank = len(w.type.shape)
    accumulator = b.op(
        "Conv",
        [b.shifted(x, x_zero, ()), b.shifted(w, w_zero, _channel_shape(w_zero, w.type.shape[0], rank, "w_zero_point"))],
        attrs,
    )
    b.op("Cast", [accumulator], {"to": "int32"}, outputs[0])


def _qlinear_matmul(b: Builder, inputs, attrs, outputs):
    a, a_scale, a_zero, w, w_scale, w_zero, y_scale, y_zero = inputs
    rows, columns = a.type.shape[-2] if len(a.type.shape) > 1 else 1, w.type.shape[-1]
    _per_tensor(y_scale, "y_scale")
    accumulator = b.op(
        "MatMul",
        [
            b.shifted(a, a_zero, _row_shape(a_zero, rows, "a_zero_point")),
            b.shifted(w, w_zero, _column_shape(w_zero, columns, "b_zero_point")),
        ],
    )
    multiplier = _multiplier(
        b,
        [(a_scale, _row_shape(a_scale, rows, "a_scale")), (w_scale, _column_shape(w_scale, columns, "b_scale"))],
        y_scale,
    )
    b.requantize(accumulator, multiplier, y_zero, outputs[0])


def _qlinear_conv(b: Builder, inputs, attrs, outputs):
    x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, bias = (*inputs, None)[:9]
    for value, what in ((x_scale, "x_scale"), (x_zero, "x_zero_point"), (y_scale, "y_scale")):
        _per_tensor(value, what)
    channels, rank = w.type.shape[0], len(w.type.shape)
    conv_inputs = [
        b.shifted(x, x_zero, ()),
        b.shifted(w, w_zero, _channel_shape(w_zero, channels, rank, "w_zero_point")),
    ]
    if bias is not None:
        conv_inputs.append(b.float32(bias))
    accumulator = b.op("Conv", conv_inputs, attrs)
    per_channel = (1, channels, *[1] * (rank - 2))
    multiplier = _multiplier(b, [(x_scale, ()), (w_scale, per_channel if w_scale.type.size > 1 else ())], y_scale)
    _channel_shape(w_scale, channels, rank, "w_scale")
    b.requantize(accumulator, multiplier, y_zero, outputs[0])


def _qgemm(b: Builder, inputs, attrs, outputs):
    a, a_scale, a_zero, w, w_scale, w_zero, bias, y_scale, y_zero = (*inputs, None, None, None)[:9]
    _per_tensor(a_scale, "a_scale")
    _per_tensor(a_zero, "a_zero_point")
    trans_b = attrs.get("transB", 0)
    columns = w.type.shape[0] if trans_b else w.type.shape[-1]
    zero_shape = _column_shape(w_zero, columns, "b_zero_point")
    if trans_b and zero_shape:
        zero_shape = (columns, 1)
    accumulator = b.op(
        "Gemm",
        [b.shifted(a, a_zero, ()), b.shifted(w, w_zero, zero_shape)],
        {"transA": attrs.get("transA", 0), "transB": trans_b},
    )
    if bias is not None:  # int32, at scale a_scale * b_scale
        accumulator = b.op("Add", [accumulator, b.float32(bias)])
    scales = [(a_scale, ()), (w_scale, _column_shape(w_scale, columns, "b_scale"))]
    if attrs.get("alpha", 1.0) != 1.0:
        scales.append((b.const(attrs["alpha"]), ()))
    multiplier = _multiplier(b, scales, y_scale)
    if y_scale is None:
        b.op("Mul", [accumulator, multiplier], {}, outputs[0])
    else:
        _per_tensor(y_scale, "y_scale")
        b.requantize(accumulator, multiplier, y_zero, outputs[0])


def _dynamic_quantize_linear(b: Builder, inputs, attrs, outputs):
    """ONNX's function body: the range of x widened to hold 0, over 255 levels, a uint8 zero point."""
    (x,) = inputs
    x = b.float32(x)
    low = b.op("Min", [b.op("ReduceMin", [x], {"keepdims": 0}), b.const(0.0)])
    high = b.op("Max", [b.op("ReduceMax", [x], {"keepdims": 0}), b.const(0.0)])
    scale = b.op("Div", [b.op("Sub", [high, low]), b.const(255.0)])
    zero = b.op(
        "Round", [b.op("Clip", [b.op("Sub", [b.const(0.0), b.op("Div", [low, scale])])], {"min": 0.0, "max": 255.0})]
    )
    zero = b.op("Cast", [zero], {"to": "uint8"}, outputs[2] if len(outputs) > 2 else None)
    b.quantize(x, scale, zero, outputs[0])
    if len(outputs) > 1 and outputs[1]:
        b.op("Identity", [scale], {}, outputs[1])


def _around(op: str, arity: int = 1):
    """QLinear<op>(x, x_scale, x_zero_point, ..., y_scale, y_zero_point): Q(op(DQ(x), ...)), as the contrib ops are
    specified (onnxruntime's kernels compute them in float, or by lookup tables built in float)."""

    def rewrite(b: Builder, inputs, attrs, outputs):
        floats = [b.dequantize(*inputs[3 * k : 3 * k + 3]) for k in range(arity)]
        y_scale, y_zero = (*inputs[3 * arity :], None, None)[:2]
        op_attrs = {key: value for key, value in attrs.items() if key not in ("channels_last", "opset")}
        if attrs.get("opset", 13) < 13 and attrs.get("axis", -1) not in (-1, len(floats[0].type.shape) - 1):
            raise UnsupportedOpError(f"QLinear{op} of opset {attrs['opset']} over a middle axis is not supported", {})
        channels_last = attrs.get("channels_last", 0)
        if channels_last:
            rank = len(floats[0].type.shape)
            floats = [b.op("Transpose", [floats[0]], {"perm": (0, rank - 1, *range(1, rank - 1))})]
        result = b.op(op, floats, op_attrs)
        if channels_last:
            rank = len(result.type.shape)
            result = b.op("Transpose", [result], {"perm": (0, *range(2, rank), 1)})
        b.quantize(result, y_scale, y_zero, outputs[0])

    return rewrite


def _qlinear_concat(b: Builder, inputs, attrs, outputs):
    y_scale, y_zero, *triples = inputs
    if len(triples) % 3 or not triples:
        raise ModelError(f"it has {len(inputs)} inputs; QLinearConcat takes y_scale, y_zero_point, then triples")
    floats = [b.dequantize(*triples[k : k + 3]) for k in range(0, len(triples), 3)]
    b.quantize(b.op("Concat", floats, {"axis": attrs["axis"]}), y_scale, y_zero, outputs[0])


def _unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The unsigned `bits`-bit values of uint8 bytes along the last axis, lowest bits first, the first `count`."""
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    values = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], -1)[..., :count]


def _matmul_nbits(b: Builder, inputs, attrs, outputs):
    a, packed, scales, zeros, group_index, bias = (*inputs, None, None, None)[:6]
    k, n, bits, block = (int(attrs[name]) for name in ("K", "N", "bits", "block_size"))
    if bits not in (2, 4, 8):
        raise UnsupportedOpError(f"MatMulNBits with bits={bits} is not supported; Tessel takes 2, 4 and 8", {})
    if block < 16 or block & (block - 1):
        raise ShapeError(f"MatMulNBits: block_size must be a power of two >= 16, not {block}")
    blocks = -(-k // block)
    expected = (n, blocks, block * bits // 8)
    if a.type.shape[-1] != k:
        raise ShapeError(f"MatMulNBits: A's last axis is {a.type.shape[-1]}, but K is {k}")
    if packed.type.dtype != "uint8" or packed.type.shape != expected:
        raise ShapeError(
            f"MatMulNBits: B must be uint8 of shape {list(expected)} (N, blocks, block_size * bits / 8); it is "
            f"{packed.type.dtype} {list(packed.type.shape)}"
        )
    if scales.type.size != n * blocks or scales.type.dtype != a.type.dtype:
        raise ShapeError(
            f"MatMulNBits: scales must be {n * blocks} {a.type.dtype} values (N * blocks); they are "
            f"{scales.type.dtype} {list(scales.type.shape)}"
        )
    weights = b.value(packed)
    if weights is None:
        raise UnsupportedOpError("MatMulNBits with weights computed at run time is not supported", {})
    if group_index is not None:
        order = b.value(group_index)
        if order is None or not np.array_equal(order.reshape(-1), np.arange(k) // block):
            raise UnsupportedOpError(
                "MatMulNBits with a reordering g_idx is not supported; quantize without act_order", {}
            )
    # (K, N): the weight as MatMul reads it, blocks of `block` consecutive k sharing a scale and zero point
    levels = b.const(_unpack(weights.reshape(n, -1), bits, k).T, "uint8")
    scale = b.op("Transpose", [b.op("Reshape", [scales], {"shape": (n, blocks)})], {"perm": (1, 0)})
    zero_array = b.value(zeros)
    if zeros is not None and zeros.type.dtype == "uint8":
        if zero_array is None:
            raise UnsupportedOpError("MatMulNBits with zero points computed at run time is not supported", {})
        per_row = -(-blocks * bits // 8)
        if zero_array.size != n * per_row:
            raise ShapeError(f"MatMulNBits: packed zero points must be {n * per_row} bytes; they are {zero_array.size}")
        zero = b.const(_unpack(zero_array.reshape(n, per_row), bits, blocks).T, "uint8")
    elif zeros is None:
        zero = b.const(np.full((blocks, n), 1 << (bits - 1)), "uint8")
    else:  # float zero points: (q - z) * s = q * s - z * s
        if zeros.type.size != n * blocks or zeros.type.dtype != a.type.dtype:
            raise ShapeError(f"MatMulNBits: zero points must be uint8 or {n * blocks} {a.type.dtype} values")
        zero = None
    weight = b.op(
        "DequantizeLinear", [levels, scale, *([zero] if zero is not None else [])], {"axis": 0, "block_size": block}
    )
    if zero is None:
        offset = b.op(
            "Mul",
            [b.op("Reshape", [zeros], {"shape": (n, blocks, 1)}), b.op("Reshape", [scales], {"shape": (n, blocks, 1)})],
        )
        offset = b.op("Expand", [offset], {"shape": (n, blocks, block)})
        offset = b.op(
            "Slice",
            [b.op("Reshape", [offset], {"shape": (n, blocks * block)})],
            {"starts": (0,), "ends": (k,), "axes": (1,)},
        )
        weight = b.op("Sub", [weight, b.op("Transpose", [offset], {"perm": (1, 0)})])
    product = b.op("MatMul", [a, weight], {}, None if bias is not None else outputs[0])
    if bias is not None:
        b.op("Add", [product, bias], {}, outputs[0])


def _gather_block_quantized(b: Builder, inputs, attrs, outputs):
    """com.microsoft.GatherBlockQuantized: Gather of a table quantized in blocks along one axis, as the blocked
    DequantizeLinear of its levels and a Gather; the table stays narrow for a CPU kernel that gathers its rows
    (passes/fold_constants.py). The levels are int4/uint4 (read as 8-bit levels), or uint8 holding two 4-bit values
    a byte (low nibble first) or one 8-bit value; an unsigned table without zero points is centred on 2^(bits-1)."""
    data, indices, scales, zeros = (*inputs, None)[:4]
    bits, block = int(attrs.get("bits", 4)), int(attrs.get("block_size", 128))
    rank = len(data.type.shape)
    gather_axis, quantize_axis = (
        int(attrs.get(name, default)) % max(rank, 1) for name, default in (("gather_axis", 0), ("quantize_axis", 1))
    )
    if bits not in (4, 8):
        raise UnsupportedOpError(f"GatherBlockQuantized with bits={bits} is not supported; Tessel takes 4 and 8", {})
    if block < 16 or block & (block - 1):
        raise ShapeError(f"GatherBlockQuantized: block_size must be a power of two >= 16, not {block}")
    table = b.value(data)
    if table is None or (zeros is not None and b.value(zeros) is None):
        raise UnsupportedOpError("GatherBlockQuantized with a table computed at run time is not supported", {})

    def blocked(shape) -> tuple[int, ...]:
        return tuple(-(-size // block) if axis == quantize_axis else size for axis, size in enumerate(shape))

    def levels_of(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """`array` as levels of `shape`: itself, or two 4-bit values a byte unpacked along the last axis."""
        if array.shape == tuple(shape):
            return array
        if bits == 4 and array.dtype == np.uint8 and array.shape[:-1] == tuple(shape[:-1]):
            return _unpack(array, 4, shape[-1])
        raise ShapeError(
            f"GatherBlockQuantized: a {array.dtype} array of shape {list(array.shape)} holds no {list(shape)} levels"
        )

    shape = tuple(data.type.shape)
    packed = data.type.dtype == "uint8" and bits == 4 and tuple(scales.type.shape) != blocked(shape)
    if packed:
        shape = (*shape[:-1], 2 * shape[-1])
    if tuple(scales.type.shape) != blocked(shape):
        raise ShapeError(
            f"GatherBlockQuantized: scales of shape {list(scales.type.shape)} do not match a table of {list(shape)} in "
            f"blocks of {block} along axis {quantize_axis}"
        )
    levels = levels_of(table, shape)
    signed = data.type.dtype == "int8"
    zero = None if zeros is None else levels_of(b.value(zeros), blocked(shape))
    if bits == 4 and rank == 2 and (gather_axis, quantize_axis) == (0, 1):
        _gather_nibble_rows(b, levels, scales, zero, indices, block, outputs[0])
        return
    if zero is None and not signed:
        zero = np.full(blocked(shape), 1 << (bits - 1), np.uint8)
    weight = b.op(
        "DequantizeLinear",
        [b.const(levels, data.type.dtype), scales, *([b.const(zero, data.type.dtype)] if zero is not None else [])],
        {"axis": quantize_axis, "block_size": block},
    )
    b.op("Gather", [weight, indices], {"axis": gather_axis}, outputs[0])


def _gather_nibble_rows(b: Builder, levels: np.ndarray, scales: Value, zero, indices: Value, block: int, output: str):
    """Rows of a (V, W) table of 4-bit levels, kept two a byte: the Gather reads the packed bytes (V, W / 2) and the
    rows' scales and zero points, the gathered bytes are split into their levels (low nibble first) and dequantized
    in blocks along the row: (nibble - 8 - zero) * scale for signed levels (stored + 8), (nibble - zero) * scale for
    unsigned ones, whose zero is 8 when the op has none. Plain ops every target has; the bundle holds half a byte a
    level."""
    offset = 8 if levels.dtype == np.int8 else 0
    if levels.size and not (0 <= int(levels.min()) + offset and int(levels.max()) + offset <= 15):
        raise ShapeError(
            f"GatherBlockQuantized with bits=4 holds {levels.dtype} levels from {levels.min()} to {levels.max()}, "
            "outside 4 bits"
        )
    nibbles = (levels.astype(np.int16) + offset).astype(np.uint8)
    width = nibbles.shape[1]
    stored = pack_nibbles(nibbles)  # (V, ceil(W / 2)) bytes
    packed = b.const(stored, "uint8")
    rows = b.op("Gather", [packed, indices], {"axis": 0})
    sixteen = b.const(np.array(16, np.uint8), "uint8")
    halves = [b.op("Unsqueeze", [b.op(op, [rows, sixteen])], {"axes": (-1,)}) for op in ("Mod", "Div")]
    pairs = b.op("Concat", halves, {"axis": -1})
    lead, count = tuple(indices.type.shape), len(indices.type.shape)
    scale_rows = b.op("Gather", [scales, indices], {"axis": 0})
    if width % block == 0:
        # whole blocks: the offset (and zero point) taken off and the scale applied per block, no zero array stored
        # for a symmetric table
        blocks = width // block
        values = b.op("Reshape", [b.float32(pairs)], {"shape": (*lead, blocks, block)})
        # the default zero point of unsigned levels, 8, is a constant like the signed levels' offset
        shift = b.const(np.array([8 if offset or zero is None else 0], np.float32))
        if zero is not None:
            zero_rows = b.op("Gather", [b.const(zero, str(zero.dtype)), indices], {"axis": 0})
            shift = b.op("Add", [b.op("Unsqueeze", [b.float32(zero_rows)], {"axes": (-1,)}), shift])
        shifted = b.op("Sub", [values, shift])
        scaled = b.op("Mul", [shifted, b.op("Unsqueeze", [b.float32(scale_rows)], {"axes": (-1,)})])
        b.op("Reshape", [scaled], {"shape": (*lead, width)}, output)
        return
    zero = np.full(scales.type.shape, 0 if offset else 8, np.int16) if zero is None else zero.astype(np.int16)
    zero_rows = b.op("Gather", [b.const((zero + offset).astype(np.uint8), "uint8"), indices], {"axis": 0})
    values = b.op("Reshape", [pairs], {"shape": (*lead, 2 * stored.shape[1])})
    if width % 2:
        values = b.op("Slice", [values], {"starts": (0,), "ends": (width,), "axes": (count,)})
    b.op("DequantizeLinear", [values, scale_rows, zero_rows], {"axis": count, "block_size": block}, output)


@dataclass(frozen=True)
class Rewrite:
    rewrite: Callable
    inputs: tuple[int, int]  # how many inputs, least and most
    attributes: dict[str, int] = field(default_factory=dict)  # for contrib ops: name -> AttributeProto type
    required: tuple[str, ...] = ()


_INT, _FLOAT, _INTS, _STRING = AttributeProto.INT, AttributeProto.FLOAT, AttributeProto.INTS, AttributeProto.STRING
_POOL = {
    "auto_pad": _STRING,
    "ceil_mode": _INT,
    "count_include_pad": _INT,
    "kernel_shape": _INTS,
    "pads": _INTS,
    "strides": _INTS,
    "channels_last": _INT,
}

# ONNX ops: their schemas check attributes and types.
REWRITES: dict[str, Rewrite] = {
    "QuantizeLinear": Rewrite(_quantize_node, (2, 3)),
    "DequantizeLinear": Rewrite(_dequantize_node, (2, 3)),
    "MatMulInteger": Rewrite(_matmul_integer, (2, 4)),
    "ConvInteger": Rewrite(_conv_integer, (2, 4)),
    "QLinearMatMul": Rewrite(_qlinear_matmul, (8, 8)),
    "QLinearConv": Rewrite(_qlinear_conv, (8, 9)),
    "DynamicQuantizeLinear": Rewrite(_dynamic_quantize_linear, (1, 1)),
}

# com.microsoft ops, which onnx.defs does not describe: their inputs and attributes are checked here.
CONTRIB_REWRITES: dict[str, Rewrite] = {
    "QuantizeLinear": Rewrite(_quantize_node, (2, 3)),
    "DequantizeLinear": Rewrite(_dequantize_node, (2, 3)),
    "QLinearAdd": Rewrite(_around("Add", 2), (7, 8)),
    "QLinearMul": Rewrite(_around("Mul", 2), (7, 8)),
    "QLinearGlobalAveragePool": Rewrite(_around("GlobalAveragePool"), (4, 5), {"channels_last": _INT}),
    "QLinearAveragePool": Rewrite(_around("AveragePool"), (4, 5), _POOL, ("kernel_shape",)),
    "QLinearSigmoid": Rewrite(_around("Sigmoid"), (4, 5)),
    "QLinearLeakyRelu": Rewrite(_around("LeakyRelu"), (4, 5), {"alpha": _FLOAT}),
    "QLinearSoftmax": Rewrite(_around("Softmax"), (4, 5), {"axis": _INT, "opset": _INT}, ("opset",)),
    "QLinearConcat": Rewrite(_qlinear_concat, (5, 1 << 30), {"axis": _INT}, ("axis",)),
    "QGemm": Rewrite(_qgemm, (6, 9), {"alpha": _FLOAT, "transA": _INT, "transB": _INT}),
    "GatherBlockQuantized": Rewrite(
        _gather_block_quantized,
        (3, 4),
        {"gather_axis": _INT, "quantize_axis": _INT, "block_size": _INT, "bits": _INT},
    ),
    "MatMulNBits": Rewrite(
        _matmul_nbits,
        (3, 6),
        {"K": _INT, "N": _INT, "bits": _INT, "block_size": _INT, "accuracy_level": _INT},
        ("K", "N", "block_size"),
    ),
}


def rewrite_for(domain: str, op_type: str) -> Rewrite | None:
    if domain == CONTRIB_DOMAIN:
        return CONTRIB_REWRITES.get(op_type)
    return REWRITES.get(op_type) if domain in ("", "ai.onnx") else None


def check_contrib(rewrite: Rewrite, op_type: str, inputs: list, attributes: list) -> None:
    """A com.microsoft node's input count and attributes, as its documentation gives them."""
    low, high = rewrite.inputs
    if not low <= len(inputs) <= high:
        raise ModelError(f"it has {len(inputs)} inputs, but {CONTRIB_DOMAIN}.{op_type} takes {low} to {high}")
    for attribute in attributes:
        kind = rewrite.attributes.get(attribute.name)
        if kind is None:
            known = ", ".join(sorted(rewrite.attributes)) or "none"
            raise ModelError(
                f"it has the attribute {attribute.name!r}, which {op_type} does not take (it takes: {known})"
            )
        if attribute.type != kind:
            raise ModelError(f"attribute {attribute.name!r} of {op_type} has the wrong type")
    missing = [name for name in rewrite.required if name not in {a.name for a in attributes}]
    if missing:
        raise ModelError(f"it lacks the required attribute(s) {', '.join(map(repr, missing))}")


def check_scale(scale: np.ndarray, what: str, dequantize: bool = False) -> None:
    """A constant scale must be finite and non-zero: a zero scale divides by zero in QuantizeLinear and erases the
    whole tensor in a per-tensor DequantizeLinear, which no quantizer writes. A DequantizeLinear's scale per axis or
    block may hold zeros: onnxruntime's quantizers write one for a block of zeros (an embedding's padding row)."""
    values = np.asarray(scale, dtype=np.float32)
    zero_allowed = dequantize and values.size > 1
    if not np.all(np.isfinite(values)) or (not zero_allowed and np.any(values == 0)):
        bad = values[~np.isfinite(values) | ((values == 0) & (not zero_allowed))].reshape(-1)[0]
        raise ModelError(
            f"{what} holds {bad}; a quantization scale must be finite and non-zero: quantize the model again"
        )


def apply(rewrite: Rewrite, builder: Builder, inputs: list[Value | None], attrs: dict[str, Any], outputs: list[str]):
    """Emit the node's rewrite; its outputs get the node's output names."""
    rewrite.rewrite(builder, inputs, attrs, outputs)
