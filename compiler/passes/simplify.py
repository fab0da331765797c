"""Algebraic simplification, run after batch-norm folding: removes ops that compute nothing at
inference and merges chains of layout ops into one.

Hands on a graph with the same graph-output Values and fewer nodes for fusion to group.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node, Value

RESHAPES = ("Reshape", "Flatten")

# op -> (input positions that may hold the neutral param, the neutral element)
NEUTRAL_OPERANDS = {"Add": ((0, 1), 0), "Sub": ((1,), 0), "Mul": ((0, 1), 1), "Div": ((1,), 1)}


def simplify(graph: Graph) -> Graph:
    """Remove Identity, inference Dropout, same-shape Reshape, identity Transpose and x*1, x+0, x-0, x/1; merge
    Reshape/Flatten chains into one Reshape and Transpose chains into one Transpose; graph outputs keep their Values."""
    result = graph.copy()
    while _rewrite_once(result):
        pass
    return result


def _rewrite_once(graph: Graph) -> bool:
    """Apply the first rewrite that matches anywhere in `graph`, in place; False if none does."""
    producers = graph.producers()
    consumers = graph.consumers()
    for node in graph.nodes:
        alias = _alias(node, graph, consumers)
        if alias is not None and _remove(graph, node, alias, producers):
            return True
        source = producers.get(node.inputs[0]) if node.inputs else None
        if source is None or not _merges(source, node):
            continue
        merged = _merge(source, node)
        if merged is None:
            continue
        graph.nodes[graph.nodes.index(node)] = merged
        if consumers[node.inputs[0]] == [node] and node.inputs[0] not in graph.outputs:
            graph.nodes.remove(source)
        return True
    return False


def _alias(node: Node, graph: Graph, consumers: dict[Value, list[Node]]) -> Value | None:
    """The input that the node's only live output always equals, or None."""
    output = node.outputs[0]
    if node.op == "Identity":
        return node.inputs[0]
    if node.op == "Dropout":
        unused = all(not consumers.get(value) and value not in graph.outputs for value in node.outputs[1:])
        return node.inputs[0] if unused and not node.attrs.get("training_mode", 0) else None
    if node.op in RESHAPES and node.inputs[0].type == output.type:
        return node.inputs[0]
    if node.op == "Transpose" and permutation(node) == tuple(range(len(output.type.shape))):
        return node.inputs[0]
    if node.op in NEUTRAL_OPERANDS:
        positions, neutral = NEUTRAL_OPERANDS[node.op]
        for position in positions:
            operand, other = node.inputs[position], node.inputs[1 - position]
            array = graph.params.get(operand)
            if array is not None and other.type == output.type and np.all(array == neutral):
                return other
    return None


def _remove(graph: Graph, node: Node, alias: Value, producers: dict[Value, Node]) -> bool:
    """Drop `node`, whose first output equals `alias`; False when that would rename a graph output."""
    output = node.outputs[0]
    if output in graph.outputs:
        # the output Value must survive, so the alias's producer defines it instead of the alias
        if alias in graph.outputs or alias not in producers:
            return False
        producer = producers[alias]
        producer.outputs[producer.outputs.index(alias)] = output
        _replace_uses(graph, alias, output)
    else:
        _replace_uses(graph, output, alias)
    graph.nodes.remove(node)
    return True


def _replace_uses(graph: Graph, old: Value, new: Value) -> None:
    for node in graph.nodes:
        node.inputs = [new if value is old else value for value in node.inputs]


def _merges(source: Node, node: Node) -> bool:
    return (source.op in RESHAPES and node.op in RESHAPES) or (source.op == node.op == "Transpose")


def _merge(source: Node, node: Node) -> Node | None:
    """One node computing node(source(x)) from x; None when the result cannot be written as one node."""
    origin, output = source.inputs[0], node.outputs[0]
    if node.op == "Transpose":
        first, second = permutation(source), permutation(node)
        composed = tuple(first[axis] for axis in second)
        return Node("Transpose", [origin], [output], {"perm": composed}, node.name)
    if 0 in output.type.shape:
        # an explicit 0 in a Reshape shape means "copy this dimension", not an empty one
        return None
    return Node("Reshape", [origin], [output], {"shape": output.type.shape}, node.name)


def permutation(node: Node) -> tuple[int, ...]:
    rank = len(node.inputs[0].type.shape)
    return tuple(node.attrs.get("perm", range(rank - 1, -1, -1)))
