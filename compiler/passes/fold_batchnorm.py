"""Batch-norm folding, run after constant folding: inference-mode BatchNormalization is an affine map
per channel, so it disappears into the weights of the Conv/Gemm/MatMul before it or becomes Mul+Add.

Hands on a graph without BatchNormalization nodes that have constant statistics; the Mul+Add it may
leave behind fuse into the producer's kernel later.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node, Value


def fold_batchnorm(graph: Graph) -> Graph:
    """Fold each inference BatchNormalization with param statistics into the weights and bias of the Conv, Gemm
    or MatMul (with param weights) whose output only it reads, or else rewrite it as Mul and Add by per-channel
    params."""
    result = graph.copy()
    producers = result.producers()
    consumers = result.consumers()
    nodes: list[Node] = []
    replaced: dict[Node, list[Node]] = {}
    for node in result.nodes:
        affine = _affine(node, result)
        if affine is None:
            nodes.append(node)
            continue
        factor, shift = affine
        source = node.inputs[0]
        producer = producers.get(source)
        private = consumers.get(source) == [node] and source not in result.outputs
        folded = _fold_into(producer, node.outputs[0], factor, shift, result) if private and producer else None
        if folded is not None:
            # the producer's slot takes the folded nodes; the BN's output is defined there from now on
            replaced[producer] = folded
        else:
            nodes.extend(_scale_shift(node, factor, shift, result))
    result.nodes = [new for node in nodes for new in replaced.get(node, [node])]
    return result


def _affine(node: Node, graph: Graph) -> tuple[np.ndarray, np.ndarray] | None:
    """(factor, shift) per channel such that BN(x) = x * factor + shift, in float64; None if not foldable."""
    if node.op != "BatchNormalization" or node.attrs.get("training_mode", 0) or len(node.outputs) != 1:
        return None
    statistics = node.inputs[1:5]
    if len(statistics) != 4 or any(value is None or value not in graph.params for value in statistics):
        return None
    scale, bias, mean, variance = (graph.params[value].astype(np.float64) for value in statistics)
    factor = scale / np.sqrt(variance + node.attrs.get("epsilon", 1e-5))
    return factor, bias - mean * factor


def _fold_into(producer: Node, output: Value, factor, shift, graph: Graph) -> list[Node] | None:
    """Nodes computing `output` = BN(producer(...)) with the BN folded into the producer's params."""
    weight = producer.inputs[1] if len(producer.inputs) > 1 else None
    if weight is None or weight not in graph.params or graph.params[weight].dtype.kind != "f":
        return None
    bias = producer.inputs[2] if len(producer.inputs) > 2 else None
    if bias is not None and bias not in graph.params:
        return None
    array = graph.params[weight].astype(np.float64)
    dtype = graph.params[weight].dtype
    if producer.op == "Conv":
        # the weight is (out_channels, in_channels / group, *kernel) and the output's channel axis is 1
        new_weight = array * factor.reshape((-1,) + (1,) * (array.ndim - 1))
        old_bias = graph.params[bias].astype(np.float64) if bias is not None else 0.0
        inputs = [producer.inputs[0], graph.add_param(f"{weight.name}_folded", new_weight.astype(dtype))]
        inputs.append(graph.add_param(f"{output.name}_bias", (old_bias * factor + shift).astype(dtype)))
        return [Node("Conv", inputs, [output], dict(producer.attrs), producer.name)]
    if producer.op == "Gemm":
        # Y = alpha * A @ op(B) + beta * C: scaling Y's columns scales op(B)'s columns and C
        attrs = dict(producer.attrs)
        column_scale = factor * attrs.pop("alpha", 1.0)
        new_weight = array * (column_scale[:, None] if attrs.get("transB", 0) else column_scale[None, :])
        old_bias = graph.params[bias].astype(np.float64) * attrs.pop("beta", 1.0) if bias is not None else 0.0
        new_bias = np.broadcast_to(old_bias * factor + shift, np.broadcast_shapes(np.shape(old_bias), factor.shape))
        inputs = [producer.inputs[0], graph.add_param(f"{weight.name}_folded", new_weight.astype(dtype))]
        inputs.append(graph.add_param(f"{output.name}_bias", np.ascontiguousarray(new_bias).astype(dtype)))
        return [Node("Gemm", inputs, [output], attrs, producer.name)]
    if producer.op == "MatMul" and array.ndim == 2 and len(output.type.shape) == 2:
        # a 2-D result's channel axis is its last, the weight's columns; MatMul has no bias, so add one
        product = Value(graph.fresh_name(f"{producer.outputs[0].name}_scaled"), output.type)
        weight_folded = graph.add_param(f"{weight.name}_folded", (array * factor[None, :]).astype(dtype))
        shift_param = graph.add_param(f"{output.name}_bias", shift.astype(dtype))
        return [
            Node("MatMul", [producer.inputs[0], weight_folded], [product], dict(producer.attrs), producer.name),
            Node("Add", [product, shift_param], [output], {}, f"{producer.name}_bias"),
        ]
    return None


def _scale_shift(node: Node, factor, shift, graph: Graph) -> list[Node]:
    """BN as x * factor + shift, with the per-channel params shaped to broadcast along axis 1."""
    source, output = node.inputs[0], node.outputs[0]
    shape = (-1,) + (1,) * (len(source.type.shape) - 2)
    dtype = source.type.dtype
    scale = graph.add_param(f"{output.name}_scale", factor.reshape(shape).astype(dtype))
    bias = graph.add_param(f"{output.name}_shift", shift.reshape(shape).astype(dtype))
    scaled = Value(graph.fresh_name(f"{output.name}_scaled"), output.type)
    return [
        Node("Mul", [source, scale], [scaled], {}, f"{node.name}_scale"),
        Node("Add", [scaled, bias], [output], {}, f"{node.name}_shift"),
    ]
