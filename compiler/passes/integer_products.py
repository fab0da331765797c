"""Integer matrix products and convolutions on CPU targets, the layout pass after alter_layout.

A quantized MatMul or Conv reaches the passes as float ops on levels (compiler/frontend/quantized.py): its input is
(Cast(x) - zero) [* scale], x uint8 activations quantized per tensor, and its weight the int8 levels of a constant
that alter_layout packed narrow (a MatMulPacked's panels, a ConvNCHWc's filter blocks) with a scale per column or
filter beside them. Computed so, every product is a float32 multiply-add of a widened byte. This pass makes such a
kernel read x itself and the levels packed four consecutive k (input channels) to an int32 word
(graph/ops/dense.py, pack_byte_words; graph/ops/conv.py, pack_conv_words): its kernel sums te.dot_bytes, which
codegen lowers to the machine's integer dot product (AVX-512 VNNI's vpdpbusd: 64 multiply-adds an instruction
against a float32 FMA's 16; pmaddwd on x86 without VNNI; i32x4.dot_i16x8_s in wasm; usdot on AArch64 with i8mm),
and takes x's zero point off once per output through the weight's column sums. The sums are exact in int32, as
onnxruntime's integer kernels are, where the float32 form rounds sums past 2**24.
- MatMulPacked -> MatMulIntegerPacked; x's per-tensor scale becomes a Mul after it, part of its epilogue.
- ConvNCHWc (group 1) -> ConvNCHWc over uint8 input and int32 words; x's scale, a constant, joins the filters'
  scales (the bias comes after it). The conv pads with the zero point, whose products the column sums take off.

What it leaves as it is: a weight with zero points (asymmetric), 4-bit levels, scales per block of k, uint8 weight
levels, int8 activations, a K or channel count (or channel block) that is not a multiple of 4, depthwise and
grouped convs, an input computed any other way. Those keep the float32 kernel, which computes the same values."""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node, TensorType, Value
from compiler.graph.ops.conv import pack_conv_words
from compiler.graph.ops.dense import pack_byte_words, pack_dense_weight, unpack_dense_weight
from compiler.target import Target

__all__ = ["integer_products"]


def integer_products(graph: Graph, target: Target) -> Graph:
    result = graph.copy()
    producers = result.producers()
    made: dict = {}  # the words and column sums of each weight, the uint8 twin of each layout conversion
    nodes = []
    for node in result.nodes:
        rewrite = {"MatMulPacked": _dense, "ConvNCHWc": _conv}.get(node.op)
        nodes.extend((rewrite and rewrite(result, node, producers, made)) or [node])
    result.nodes = nodes
    return result


def _dense(graph: Graph, node: Node, producers: dict, made: dict) -> list[Node] | None:
    """A MatMulPacked of quantized activations by int8 levels as a MatMulIntegerPacked (and a Mul by x's scale)."""
    if len(node.inputs) != 3 or node.attrs.get("bits", 8) != 8 or node.attrs.get("block"):
        return None
    a, levels, scale = node.inputs
    if not _int8_param(graph, levels) or scale not in graph.params or a.type.shape[-1] % 4:
        return None
    matched = _quantized_input(graph, a, producers, made)
    if matched is None:
        return None
    activations, zero, multiplier, added = matched
    columns = int(node.attrs["columns"])
    panel = levels.type.shape[-1]
    if (levels, columns) not in made:
        weight = unpack_dense_weight(graph.params[levels], columns)
        sums = pack_dense_weight(weight.sum(axis=0, keepdims=True, dtype=np.int32), panel)
        made[levels, columns] = (
            graph.add_param(f"{levels.name}_words", pack_byte_words(weight, panel)),
            graph.add_param(f"{levels.name}_column_sums", sums),
        )
    packed, sums = made[levels, columns]
    inputs = [activations, packed, scale, *((sums, zero) if zero is not None else ())]
    (output,) = node.outputs
    if multiplier is None:
        return [*added, Node("MatMulIntegerPacked", inputs, [output], {"columns": columns}, node.name)]
    product = Value(graph.fresh_name(f"{output.name}_integer"), output.type)
    return [
        *added,
        Node("MatMulIntegerPacked", inputs, [product], {"columns": columns}, node.name),
        Node("Mul", [product, multiplier], [output], {}, f"{node.name}_scale"),
    ]


def _conv(graph: Graph, node: Node, producers: dict, made: dict) -> list[Node] | None:
    """A group-1 ConvNCHWc of quantized activations by int8 levels over the activations and int32 words."""
    if len(node.inputs) != 4 or node.inputs[3] is None or int(node.attrs.get("group", 1)) != 1:
        return None
    x, levels, bias, scale = node.inputs
    if not _int8_param(graph, levels) or scale not in graph.params or levels.type.shape[1] % 4 or x.type.shape[-1] % 4:
        return None
    matched = _quantized_input(graph, x, producers, made)
    if matched is None:
        return None
    activations, zero, multiplier, added = matched
    if multiplier is not None and multiplier not in graph.params:
        return None  # a scale known only at run time would have to come before the bias
    if levels not in made:
        packed = graph.params[levels]
        sums = packed.sum(axis=(1, 2, 3), dtype=np.int32).reshape(-1)
        made[levels] = (
            graph.add_param(f"{levels.name}_words", pack_conv_words(packed)),
            graph.add_param(f"{levels.name}_column_sums", sums),
        )
    packed, sums = made[levels]
    if multiplier is not None:
        factor = np.float32(np.asarray(graph.params[multiplier]).reshape(-1)[0])
        scale = graph.add_param(f"{scale.name}_times_input_scale", graph.params[scale].astype(np.float32) * factor)
    inputs = [activations, packed, bias, scale, *((sums, zero) if zero is not None else ())]
    return [*added, Node("ConvNCHWc", inputs, list(node.outputs), dict(node.attrs), node.name)]


def _int8_param(graph: Graph, value: Value) -> bool:
    return value in graph.params and value.type.dtype == "int8"


def _quantized_input(graph: Graph, a: Value, producers: dict, made: dict) -> tuple | None:
    """(uint8 activations, their uint8 zero point or None, a one-element float32 multiplier or None, nodes to add
    first) when `a` is (Cast(x) - zero) [* multiplier] of a uint8 x of a's shape, or a LayoutTransform of that (the
    conversion into a blocked conv's layout): then of x converted (a LayoutTransform of x, made once and kept in
    `made`; its padded channels are zeros, which meet zero weights), else None."""
    layout = producers.get(a)
    if layout is not None and layout.op == "LayoutTransform" and len(a.type.shape) == 5:
        matched = _quantized_input(graph, layout.inputs[0], producers, made)
        if matched is None:
            return None
        plain, zero, multiplier, _ = matched
        key = ("layout", plain, a.type.shape)
        added = []
        if key not in made:
            blocked = Value(
                graph.fresh_name(f"{plain.name}_{layout.attrs['dst'].lower()}"), TensorType(a.type.shape, "uint8")
            )
            made[key] = blocked
            added.append(Node("LayoutTransform", [plain], [blocked], dict(layout.attrs), f"{layout.name}_uint8"))
        return made[key], zero, multiplier, added
    multiplier = None
    producer = producers.get(a)
    if producer is not None and producer.op == "Mul":
        for shifted, factor in (producer.inputs, producer.inputs[::-1]):
            if factor.type.size == 1 and factor.type.dtype == "float32" and shifted.type == a.type:
                multiplier, producer = factor, producers.get(shifted)
                break
    zero = None
    if producer is not None and producer.op == "Sub" and producer.inputs[1].type.size == 1:
        zero = _zero_point(graph, producer.inputs[1], producers)
        if zero is None:
            return None
        producer = producers.get(producer.inputs[0])
    if producer is None or producer.op != "Cast" or producer.inputs[0].type.dtype != "uint8":
        return None
    activations = producer.inputs[0]
    if activations.type.shape != a.type.shape:
        return None
    if isinstance(zero, np.ndarray):  # a constant zero point, folded to float32 by fold_constants
        zero = None if not zero.any() else graph.add_param(f"{activations.name}_zero_point", zero)
    return activations, zero, multiplier, []


def _zero_point(graph: Graph, value: Value, producers: dict) -> Value | np.ndarray | None:
    """The uint8 zero point that one-element `value` widens: a uint8 value seen through Reshapes and a Cast to float32
    (a zero point computed at run time: DynamicQuantizeLinear's), a (1,) uint8 array of a constant one; None when
    `value` is neither."""
    while True:
        if value in graph.params:
            array = np.asarray(graph.params[value]).reshape(-1)
            if array.dtype == np.uint8:
                return array.reshape(1).copy()
            if not (0 <= array[0] <= 255 and array[0] == np.round(array[0])):
                return None
            return array.astype(np.uint8).reshape(1)
        if value.type.dtype == "uint8":
            return value
        producer = producers.get(value)
        if producer is None or producer.op not in ("Reshape", "Cast"):
            return None
        if producer.op == "Cast" and producer.inputs[0].type.dtype != "uint8":
            return None
        value = producer.inputs[0]
