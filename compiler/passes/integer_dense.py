"""Integer matrix products on CPU targets, the layout pass after alter_layout.

A quantized MatMul reaches the passes as float ops on levels (compiler/frontend/quantized.py): A is
(Cast(x) - zero) [* scale], x uint8 activations quantized per tensor, and B the int8 levels of a constant weight that
pack_dense packed into a MatMulPacked's panels, a scale per column beside them. Computed so, every product is a
float32 multiply-add of a widened byte. This pass makes such a MatMulPacked a MatMulIntegerPacked over x itself and
the levels packed four consecutive k to an int32 word (graph/ops/dense.py, pack_byte_words): its kernel sums
te.dot_bytes, which codegen lowers to the machine's integer dot product (AVX-512 VNNI's vpdpbusd: 64 multiply-adds
an instruction against a float32 FMA's 16; pmaddwd on x86 without VNNI; i32x4.dot_i16x8_s in wasm), and takes A's
zero point off once per output through the weight's column sums. A per-tensor scale of A becomes a Mul after the
product, which fusion makes part of its epilogue. The result is exact in int32, as onnxruntime's integer kernels
are, where the float32 form rounds sums past 2**24.

What it leaves as it is: a weight with zero points (asymmetric), 4-bit levels, scales per block of k, uint8 weight
levels, int8 activations, a K that is not a multiple of 4, an A computed any other way. Those keep the float32
kernel, which computes the same values."""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node, Value
from compiler.graph.ops.dense import pack_byte_words, pack_dense_weight, unpack_dense_weight
from compiler.target import Target

__all__ = ["integer_dense"]


def integer_dense(graph: Graph, target: Target) -> Graph:
    result = graph.copy()
    producers = result.producers()
    words: dict[tuple[Value, int], tuple[Value, Value]] = {}
    nodes = []
    for node in result.nodes:
        matched = _integer_operands(result, node, producers)
        if matched is None:
            nodes.append(node)
            continue
        activations, zero, multiplier = matched
        _, levels, scale = node.inputs
        columns = int(node.attrs["columns"])
        panel = levels.type.shape[-1]
        if (levels, columns) not in words:
            weight = unpack_dense_weight(result.params[levels], columns)
            sums = pack_dense_weight(weight.sum(axis=0, keepdims=True, dtype=np.int32), panel)
            words[levels, columns] = (
                result.add_param(f"{levels.name}_words", pack_byte_words(weight, panel)),
                result.add_param(f"{levels.name}_column_sums", sums),
            )
        packed, sums = words[levels, columns]
        inputs = [activations, packed, scale, *((sums, zero) if zero is not None else ())]
        (output,) = node.outputs
        product = output if multiplier is None else Value(result.fresh_name(f"{output.name}_integer"), output.type)
        nodes.append(Node("MatMulIntegerPacked", inputs, [product], {"columns": columns}, node.name))
        if multiplier is not None:
            nodes.append(Node("Mul", [product, multiplier], [output], {}, f"{node.name}_scale"))
    result.nodes = nodes
    return result


def _integer_operands(graph: Graph, node: Node, producers: dict) -> tuple | None:
    """(uint8 activations, their uint8 zero point or None, a one-element float32 multiplier or None) when `node` is
    a MatMulPacked that integer_dense rewrites, else None."""
    if node.op != "MatMulPacked" or len(node.inputs) != 3 or node.attrs.get("bits", 8) != 8 or node.attrs.get("block"):
        return None
    a, levels, scale = node.inputs
    if levels not in graph.params or levels.type.dtype != "int8" or scale not in graph.params:
        return None
    if a.type.shape[-1] % 4:
        return None
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
    return activations, zero, multiplier


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
