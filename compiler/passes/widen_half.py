"""float16 models computed in float32 on CPU targets, the first of the CPU layout passes.

A float16 model (onnxruntime's converter, a `model_fp16.onnx`) computes every op in float16. CPUs and wasm have no
float16 arithmetic: a float16 op widens each element to float32, computes, and rounds back, at every step, and its
kernels read and write half the bytes but run 1.5-3x slower than the float32 model's (benchmarks/quantized.py on
BERT-base, DistilBERT, ResNet-50 and MobileNetV3). This pass makes every float16 value inside the graph float32:
- a float16 param read as a MatMul or Gemm weight or a Gather's table (fold_constants.NARROW_WEIGHT_READERS; a
  Conv's too, which alter_layout widens at compile time) of at least registry.DECOMPRESS_MIN_ELEMENTS elements
  becomes Cast(float16 param), the narrow weight that pack_dense keeps float16 in the bundle and the kernel widens
  as it reads, or that a Gather's group widens for the rows it gathers (a param also read elsewhere is widened for
  those readers at compile time); smaller params are widened;
- a float16 graph input is widened by a Cast after it, a float16 graph output rounded by a Cast before it;
- a Cast to float16 inside the graph becomes a Cast to float32, so intermediate values are not rounded to float16.
The results are float32 computations of the model's float16 weights: at least as accurate as the float16 graph, and
within float16's rounding of onnxruntime's (tests/passes/test_widen_half.py states the tolerance). A graph without
float16 values is returned as it is."""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node, TensorType, Value
from compiler.graph.registry import DECOMPRESS_MIN_ELEMENTS
from compiler.passes.fold_constants import NARROW_WEIGHT_READERS
from compiler.target import Target

__all__ = ["widen_half"]

HALF, FULL = "float16", "float32"
# attributes that name a dtype
DTYPE_ATTRIBUTES = {"Cast": "to"}


def widen_half(graph: Graph, target: Target) -> Graph:
    values = graph.values()
    if not any(value.type.dtype == HALF for value in values):
        return graph
    result = Graph(name=graph.name)
    widened: dict[Value, Value] = {}

    def wide(value: Value) -> Value:
        """The float32 twin of a float16 value (made once), or the value itself."""
        if value.type.dtype != HALF:
            return value
        if value not in widened:
            widened[value] = Value(graph.fresh_name(value.name), TensorType(value.type.shape, FULL))
        return widened[value]

    weights = _narrow_weights(graph)
    for value, array in graph.params.items():
        if value.type.dtype != HALF:
            result.params[value] = array
        elif value in weights:
            result.params[value] = array  # stays float16: a Cast widens it for its weight readers below
        else:
            result.params[wide(value)] = array.astype(np.float32)
            if value in graph.outputs:  # a float16 param the model outputs as it is
                result.params[value] = array
    for value in graph.inputs:
        result.inputs.append(value)
        if value.type.dtype == HALF:
            result.nodes.append(Node("Cast", [value], [wide(value)], {"to": FULL}, f"{value.name}_widen"))
    casts: dict[Value, Value] = {}
    for node in graph.nodes:
        inputs = []
        for value in node.inputs:
            if value is not None and value in weights and node.op == "Cast":  # already widened where it is read
                inputs.append(value)
            elif value is not None and value in weights:
                if value not in casts:
                    twin = Value(graph.fresh_name(f"{value.name}_float32"), TensorType(value.type.shape, FULL))
                    result.nodes.append(Node("Cast", [value], [twin], {"to": FULL}, f"{value.name}_widen"))
                    casts[value] = twin
                inputs.append(casts[value])
            else:
                inputs.append(None if value is None else wide(value))
        attrs = dict(node.attrs)
        key = DTYPE_ATTRIBUTES.get(node.op)
        if key and attrs.get(key) == HALF:
            attrs[key] = FULL
        result.nodes.append(Node(node.op, inputs, [wide(value) for value in node.outputs], attrs, node.name))
    produced = {value for node in graph.nodes for value in node.outputs}
    for value in graph.outputs:
        if value.type.dtype == HALF and value in produced:  # the model's float16 output, rounded once at the end
            result.nodes.append(Node("Cast", [wide(value)], [value], {"to": HALF}, f"{value.name}_round"))
        result.outputs.append(value)
    return result


def _narrow_weights(graph: Graph) -> set[Value]:
    """The float16 params large enough to keep narrow that only weight readers read, as their weight, or Casts to
    float32 (the form --weights fp16 and mixed-precision converters write)."""
    readers: dict[Value, list[tuple[str, int]]] = {}
    for node in graph.nodes:
        for position, value in enumerate(node.inputs):
            if value is not None:
                readers.setdefault(value, []).append((node.op, position, node.attrs.get("to")))
    return {
        value
        for value in graph.params
        if value.type.dtype == HALF
        and value.type.size >= DECOMPRESS_MIN_ELEMENTS
        and value not in graph.outputs
        and all(
            NARROW_WEIGHT_READERS.get(op) == position or (op, to) == ("Cast", FULL)
            for op, position, to in readers.get(value, [(None, 0, None)])
        )
    }
